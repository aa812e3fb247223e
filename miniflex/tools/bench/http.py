"""Drive an OpenAI-compatible vLLM server that is already running (``--url``).

TTFT is the time from sending a streaming ``/v1/completions`` request (the
prompt as a list of token ids) to its first chunk that carries a token.
Hits of a request sent alone come from the changes of vLLM's Prometheus
counters (``/metrics``) around it: ``vllm:prefix_cache_hits`` (vLLM's own) and
``vllm:external_prefix_cache_hits`` (loaded by a KV connector). Streaming
responses carry no ``kv_transfer_params``, so MiniFlex's per-tier split is not
available here; under the open loop, per-request hits are known only when the
server runs with ``--enable-prompt-tokens-details``.

Standard library only (``urllib``, threads), so it runs wherever Python does.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from miniflex.errors import MiniFlexError
from miniflex.tools.bench.driver import Arrival, Driver
from miniflex.tools.bench.model import PromptMaker
from miniflex.tools.bench.samples import Sample

__all__ = ["HttpDriver", "parse_metrics"]

_LINE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text format -> ``{name: [(labels, value), ...]}``."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and not line.startswith("#"):
            labels = dict(_LABEL.findall(m.group(2) or ""))
            out.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return out


class HttpDriver(Driver):
    """A running server, named ``name`` in the results; it is never started or stopped here."""

    def __init__(
        self, name: str, url: str, prompts: PromptMaker, capacity_tokens: int | None = None
    ) -> None:
        self.name = name
        self.url = url.rstrip("/")
        self.prompts = prompts
        models = self._get_json("/v1/models")["data"][0]
        self.model = models["id"]
        self.max_model_len = int(models.get("max_model_len") or 4096)
        self.capacity_tokens = capacity_tokens or self._capacity()
        self._fillers = 0

    # ---- HTTP ----
    def _get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=60) as r:
            return r.read().decode()

    def _get_json(self, path: str) -> Any:
        return json.loads(self._get(path))

    def _capacity(self) -> int:
        for labels, _ in parse_metrics(self._get("/metrics")).get("vllm:cache_config_info", []):
            blocks, size = labels.get("num_gpu_blocks"), labels.get("block_size")
            if blocks and size and blocks != "None":
                return int(blocks) * int(size)
        raise MiniFlexError(
            f"{self.url}/metrics does not say the server's KV capacity; pass --gpu-blocks and "
            "--block-size as the server was started with"
        )

    def _counters(self) -> tuple[float, float, float]:
        m = parse_metrics(self._get("/metrics"))

        def total(name: str) -> float:
            return sum(v for _, v in m.get(name + "_total", m.get(name, [])))

        return (
            total("vllm:prefix_cache_queries"),
            total("vllm:prefix_cache_hits"),
            total("vllm:external_prefix_cache_hits"),
        )

    def _stream(self, tokens: Sequence[int], max_tokens: int) -> tuple[float, float, dict]:
        """(seconds to the first token, seconds to the end, final usage or {})."""
        body = {
            "model": self.model,
            "prompt": list(tokens),
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        req = urllib.request.Request(
            self.url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        t0 = time.perf_counter()
        first, usage = None, {}
        with urllib.request.urlopen(req, timeout=600) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if first is None and chunk.get("choices"):
                    first = time.perf_counter() - t0
                usage = chunk.get("usage") or usage
        end = time.perf_counter() - t0
        return (first if first is not None else end), end, usage

    # ---- Driver ----
    def prefill(self, tokens: Sequence[int], label: str) -> Sample:
        q0, hits0, ext0 = self._counters()
        ttft, end, _ = self._stream(tokens, 1)
        deadline = time.monotonic() + 2.0
        while True:  # the server updates its counters just after the response ends
            q1, hits1, ext1 = self._counters()
            if q1 - q0 >= len(tokens) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        return Sample(
            label=label,
            prompt_tokens=len(tokens),
            ttft_ms=round(1e3 * ttft, 2),
            e2e_ms=round(1e3 * end, 2),
            cached_tokens=int(hits1 - hits0 + ext1 - ext0),
            external_tokens=int(ext1 - ext0),
        )

    def open_loop(self, arrivals: Sequence[Arrival]) -> tuple[list[Sample], float]:
        samples: list[Sample] = []
        lock = threading.Lock()
        t0 = time.perf_counter()

        def send(a: Arrival) -> None:
            time.sleep(max(0.0, a.at_s - (time.perf_counter() - t0)))
            sent = time.perf_counter() - t0
            ttft, end, usage = self._stream(a.tokens, a.max_tokens)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            s = Sample(
                label=a.label,
                prompt_tokens=len(a.tokens),
                ttft_ms=round(1e3 * (sent - a.at_s + ttft), 2),
                e2e_ms=round(1e3 * (sent - a.at_s + end), 2),
                output_tokens=int(usage.get("completion_tokens") or a.max_tokens),
                arrival_s=a.at_s,
                cached_tokens=cached,
            )
            with lock:
                samples.append(s)

        with ThreadPoolExecutor(max_workers=min(256, max(1, len(arrivals)))) as pool:
            for f in [pool.submit(send, a) for a in arrivals]:
                f.result()
        if not samples:
            return samples, 0.0
        start = min(s.arrival_s for s in samples)
        end = max(s.arrival_s + s.e2e_ms / 1e3 for s in samples)
        return samples, end - start

    def evict_gpu(self) -> None:
        """Unique fillers worth 1.5x the KV capacity push every earlier prompt out of vLLM's LRU."""
        length = max(16, min(self.capacity_tokens // 2, self.max_model_len - 16))
        for _ in range(-(-3 * self.capacity_tokens // (2 * length))):
            self._fillers += 1
            self._stream(self.prompts(length, "filler", self.name, self._fillers), 1)

    def reset(self) -> bool:
        return False

    def close(self) -> None:
        return  # the server belongs to whoever started it
