"""The ``--url`` driver against a small fake of vLLM's OpenAI server (SSE and /metrics)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from miniflex.tools.bench.driver import Arrival
from miniflex.tools.bench.http import HttpDriver, parse_metrics
from miniflex.tools.bench.model import PromptMaker


class FakeVLLM(BaseHTTPRequestHandler):
    """Remembers prompts; a prompt seen before is a full local hit but for its last token."""

    seen: ClassVar[set[tuple[int, ...]]] = set()
    counters: ClassVar[dict[str, int]] = {"queries": 0, "hits": 0}
    lock = threading.Lock()

    def log_message(self, *args: object) -> None:
        return

    def _send(self, body: str, ctype: str = "application/json") -> None:
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(json.dumps({"data": [{"id": "tiny", "max_model_len": 2048}]}))
            return
        c = self.counters
        self._send(
            "# HELP vllm:prefix_cache_hits_total x\n"
            f'vllm:prefix_cache_queries_total{{engine="0"}} {c["queries"]}.0\n'
            f'vllm:prefix_cache_hits_total{{engine="0"}} {c["hits"]}.0\n'
            'vllm:external_prefix_cache_hits_total{engine="0"} 0.0\n'
            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="64"} 1.0\n',
            "text/plain",
        )

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = tuple(req["prompt"])
        with self.lock:
            hit = len(prompt) - 1 if prompt in self.seen else 0
            self.seen.add(prompt)
            self.counters["queries"] += len(prompt)
            self.counters["hits"] += hit
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(req["max_tokens"]):
            self.wfile.write(b'data: {"choices": [{"index": 0, "text": ""}]}\n\n')
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": req["max_tokens"],
            "prompt_tokens_details": {"cached_tokens": hit},
        }
        self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture()
def url() -> Iterator[str]:
    FakeVLLM.seen = set()
    FakeVLLM.counters = {"queries": 0, "hits": 0}
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeVLLM)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_metrics_are_parsed_with_their_labels() -> None:
    m = parse_metrics('# TYPE x counter\nx_total{a="1",b="two"} 3.5\ny 2\n')
    assert m == {"x_total": [({"a": "1", "b": "two"}, 3.5)], "y": [({}, 2.0)]}


def test_prefill_reads_capacity_ttft_and_hits_from_the_server(url: str) -> None:
    prompts = PromptMaker(1000)
    d = HttpDriver("plain", url, prompts)
    assert (d.model, d.max_model_len, d.capacity_tokens) == ("tiny", 2048, 64 * 16)
    tokens = prompts(300, "p")
    cold, warm = d.prefill(tokens, "cold"), d.prefill(tokens, "warm")
    assert cold.cached_tokens == 0 and cold.external_tokens == 0
    assert warm.cached_tokens == 299 and warm.vllm_hit_tokens == 299
    assert cold.ttft_ms > 0 and cold.e2e_ms >= cold.ttft_ms
    assert d.reset() is False


def test_eviction_sends_fillers_worth_one_and_a_half_capacities(url: str) -> None:
    d = HttpDriver("plain", url, PromptMaker(1000))
    before = FakeVLLM.counters["queries"]
    d.evict_gpu()
    assert FakeVLLM.counters["queries"] - before == 3 * 512  # fillers of capacity / 2 tokens


def test_open_loop_sends_on_schedule_and_reads_usage(url: str) -> None:
    prompts = PromptMaker(1000)
    d = HttpDriver("plain", url, prompts, capacity_tokens=4096)
    assert d.capacity_tokens == 4096
    shared = prompts(200, "shared")
    arrivals = [Arrival(0.05 * i, shared, 3, "long") for i in range(4)]
    samples, makespan = d.open_loop(arrivals)
    assert len(samples) == 4 and makespan >= 0.15
    assert sorted(s.cached_tokens for s in samples)[-1] == 199
    assert all(s.output_tokens == 3 and s.label == "long" for s in samples)
