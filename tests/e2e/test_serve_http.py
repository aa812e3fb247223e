"""``miniflex serve`` end to end: the OpenAI-compatible server, driven over HTTP."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.e2e.engine import expected_hit, prompt
from tests.e2e.serve_proc import serving

pytestmark = pytest.mark.e2e
PROMPT_TOKENS = 1000


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with serving(tiny_model, log, {"MINIFLEX_CPU_BYTES": "256MiB"}) as url:
        yield url


def complete(url: str, tokens: list[int]) -> dict:
    model = requests.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    body = {
        "model": model,
        "prompt": tokens,
        "max_tokens": 4,
        "temperature": 0,
        "return_token_ids": True,
        "detokenize": False,
    }
    r = requests.post(url + "/v1/completions", json=body, timeout=120)
    r.raise_for_status()
    return r.json()


def test_prompt_evicted_by_other_traffic_comes_back_from_miniflex(server: str) -> None:
    first = complete(server, prompt(11, PROMPT_TOKENS))
    assert first["kv_transfer_params"]["miniflex"]["hit_tokens"] == 0
    for i in range(5):  # five other prompts push the first out of vLLM's 3-prompt KV cache
        complete(server, prompt(20 + i, PROMPT_TOKENS))
    again = complete(server, prompt(11, PROMPT_TOKENS))
    assert again["kv_transfer_params"]["miniflex"]["hit_tokens"] == expected_hit(PROMPT_TOKENS)
    assert again["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]
    assert again["kv_transfer_params"]["miniflex"]["hit_tokens_cpu"] == expected_hit(PROMPT_TOKENS)


def test_metrics_endpoint_shows_miniflex_counters(server: str) -> None:
    """Prometheus sees MiniFlex's counters (vLLM publishes them every stats interval)."""
    tokens = prompt(31, PROMPT_TOKENS)
    complete(server, tokens)
    for i in range(5):
        complete(server, prompt(40 + i, PROMPT_TOKENS))
    complete(server, tokens)
    deadline = time.monotonic() + 30
    while True:
        text = requests.get(server + "/metrics", timeout=10).text
        hits = sample(text, "vllm:miniflex_hit_tokens_total", 'tier="cpu"')
        if (hits and hits[0] > 0) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert hits and hits[0] >= expected_hit(PROMPT_TOKENS), text[-2000:]
    assert "vllm:miniflex_stored_tokens_total" in text
    # vLLM's own per-source count (0.32+) calls MiniFlex's CPU tier "host"
    host = sample(text, "vllm:prompt_tokens_cached_by_source_total", 'source="host"')
    assert host and host[0] >= expected_hit(PROMPT_TOKENS), text[-2000:]
    assert sample(text, "vllm:prompt_tokens_cached_by_source_total", 'source="external_') == [0]


def sample(text: str, name: str, label: str) -> list[float]:
    """The values of Prometheus samples ``name{...label...}`` in a /metrics page."""
    return [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and label in line
    ]


def test_out_of_vocabulary_ids_cost_one_400_never_the_server(server: str, tiny_model: Path) -> None:
    """With the tokenizer skipped vLLM does not check ids; an id past the embedding table
    killed the engine core (HTTP 500, then /health 503 and shutdown)."""
    vocab = json.loads((tiny_model / "config.json").read_text())["vocab_size"]
    model = requests.get(server + "/v1/models", timeout=10).json()["data"][0]["id"]
    for bad in ([1, 2, vocab], [-3, 4], [[5, 6], [vocab + 1000]]):
        body = {"model": model, "prompt": bad, "max_tokens": 2, "detokenize": False}
        r = requests.post(server + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 400, r.text
        assert "is out of vocabulary" in r.json()["error"]["message"]
    assert requests.get(server + "/health", timeout=10).status_code == 200
    tokens = prompt(51, 64)
    assert complete(server, tokens)["choices"][0]["token_ids"]
    assert requests.get(server + "/health", timeout=10).status_code == 200
