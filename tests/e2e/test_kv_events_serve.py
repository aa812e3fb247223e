"""Tier-tagged KV events from a running ``miniflex serve``, read as a router reads them.

A subscriber on vLLM's own ZMQ event stream rebuilds MiniFlex's CPU and SSD tiers
from the events alone; once the engine is idle that must be what ``miniflex
inspect`` reports, chunk for chunk, and every chunk must carry its prompt's tokens.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zmq

from miniflex.tools.inspect_status import load_status
from tests.e2e.engine import CHUNK_TOKENS, KV_BYTES_PER_TOKEN, prompt
from tests.e2e.serve_proc import free_port, serving
from tests.e2e.test_serve_http import complete

pytestmark = pytest.mark.e2e
PROMPT_TOKENS = 1000
CPU_MEDIUM = "CPU"
SSD_MEDIA = ("STORAGE", "FS")  # vLLM's name of its disk tier, by version


class Subscriber:
    """vLLM's KV event stream: (topic, sequence number, msgpack'd KVEventBatch) messages."""

    def __init__(self, port: int) -> None:
        from vllm.distributed.kv_events import KVEventBatch

        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.connect(f"tcp://127.0.0.1:{port}")
        self._decode = msgspec.msgpack.Decoder(type=KVEventBatch).decode
        self.tiers: dict[str, dict[tuple, list[int]]] = {"cpu": {}, "ssd": {}}
        self.batches = 0

    def drain(self, seconds: float) -> None:
        """Apply every batch that arrives within ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if not self._sock.poll(int(left * 1000)):
                return
            _topic, _seq, payload = self._sock.recv_multipart()
            self.batches += 1
            for e in self._decode(payload).events:
                self._apply(e)

    def _apply(self, e: object) -> None:
        medium = getattr(e, "medium", None)
        tier = "cpu" if medium == CPU_MEDIUM else "ssd" if medium in SSD_MEDIA else None
        if tier is None:  # vLLM's own GPU blocks
            return
        chunk = tuple(e.block_hashes)  # type: ignore[attr-defined]
        if type(e).__name__ == "BlockStored":
            self.tiers[tier][chunk] = list(e.token_ids)  # type: ignore[attr-defined]
        elif type(e).__name__ == "BlockRemoved":
            del self.tiers[tier][chunk]

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()


@pytest.fixture
def served(tiny_model: Path, ssd_dir: Path, tmp_path: Path) -> Iterator[tuple[str, int, Path]]:
    """A server whose CPU tier holds 8 chunks (a prompt has 15) over a 64 MiB SSD tier,
    publishing KV events on a port of its own."""
    events_port, status = free_port(), tmp_path / "status.json"
    env = {
        "PYTHONHASHSEED": "0",
        "MINIFLEX_CPU_BYTES": str(8 * CHUNK_TOKENS * KV_BYTES_PER_TOKEN),
        "MINIFLEX_SSD_DIRS": str(ssd_dir),
        "MINIFLEX_SSD_BYTES": "64MiB",
        "MINIFLEX_PREFILL_TOKENS_PER_S": "100",  # the disk keeps up: every chunk is kept
        "MINIFLEX_STATUS_FILE": str(status),
    }
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{events_port}",  # the engine binds, routers connect
    }
    args = ("--kv-events-config", json.dumps(events))
    with serving(tiny_model, tmp_path / "server.log", env, args) as url:
        yield url, events_port, status


def resident(status: Path) -> dict[str, int]:
    """Chunks per tier, as ``miniflex inspect`` reports them."""
    return {t["tier"]: t["resident"] for t in load_status(status)["tiers"]}


def test_events_alone_rebuild_what_inspect_reports(served: tuple[str, int, Path]) -> None:
    url, events_port, status = served
    sub = Subscriber(events_port)
    try:
        sub.drain(1.0)  # the subscription is in place before the first event
        prompts = [prompt(300 + i, PROMPT_TOKENS) for i in range(4)]
        for tokens in prompts + prompts[:1]:  # the last one loads back from the tiers
            complete(url, tokens)
            sub.drain(0.5)
        deadline = time.monotonic() + 60
        while True:  # write-backs end after the requests; the status file is rewritten
            sub.drain(2.0)
            rebuilt = {tier: len(chunks) for tier, chunks in sub.tiers.items()}
            if rebuilt == resident(status) or time.monotonic() > deadline:
                break
        assert rebuilt == resident(status), f"{sub.batches} batches"
        assert rebuilt["ssd"] >= PROMPT_TOKENS // CHUNK_TOKENS, "no overflow to SSD"
        whole = PROMPT_TOKENS // CHUNK_TOKENS * CHUNK_TOKENS
        chunks = [t[i : i + CHUNK_TOKENS] for t in prompts for i in range(0, whole, CHUNK_TOKENS)]
        for tier in ("cpu", "ssd"):
            for tokens in sub.tiers[tier].values():
                assert tokens in chunks, f"a {tier} chunk's tokens are no prompt's"
    finally:
        sub.close()
