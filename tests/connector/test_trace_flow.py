"""The per-request tier trace (``trace_file``) through vLLM's real Scheduler.

Each finished request appends one JSON line; across a restart on the same SSD
directory the lines say, chunk by chunk, what vLLM computed, what its own cache
held, what MiniFlex loaded from which tier, and which chunk failed its checksum.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from miniflex.keys import chunk_key
from tests.connector.harness import BLOCK, Harness, make_harness
from tests.connector.test_ssd_flow import (
    CHUNK,
    CHUNKS,
    SLOT,
    damage_slot,
    harness,
    serve_again,
    ssd,
    tokens,
)

__all__ = ["ssd"]  # the fixture, shared with the SSD flow tests


def lines(path: Path) -> dict[str, dict[str, Any]]:
    """The trace's lines by request (vLLM's request ids are the harness's)."""
    return {d["request"]: d for d in map(json.loads, path.read_text().splitlines())}


def keys_of(h: Harness, req_id: str) -> list[str]:
    """The request's chunk keys as the trace names them."""
    ns = h.manager_side.ns
    hashes = h.requests[req_id].block_hashes
    return [f"{chunk_key(ns, bytes(hashes[2 * i + 1])):032x}" for i in range(CHUNKS)]


def test_the_trace_names_each_chunks_source_across_a_restart(tmp_path: Path, ssd: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    h = harness(tmp_path, ssd, ssd_write="through", trace_file=str(trace))
    prompt = tokens(2)
    h.serve("a", prompt)
    h.serve("a-gpu", prompt)  # vLLM's own cache holds it: MiniFlex loads nothing
    h.run()
    h.worker.shutdown()
    first = lines(trace)
    cold, gpu = first["a"], first["a-gpu"]
    assert [c["from"] for c in cold["chunks"]] == ["computed"] * CHUNKS
    assert [c["key"] for c in cold["chunks"]] == keys_of(h, "a")
    assert cold["tokens"]["computed"] == len(prompt) and cold["prompt_tokens"] == len(prompt)
    assert cold["stored_tokens"] == CHUNKS * CHUNK
    assert [c["from"] for c in gpu["chunks"]] == ["gpu"] * CHUNKS
    assert gpu["tokens"]["gpu"] == (len(prompt) - 1) // BLOCK * BLOCK

    damage_slot(ssd, 2)  # the third chunk (SSD slots are handed out in order)
    h2 = harness(tmp_path, ssd, trace_file=str(trace))
    assert serve_again(h2, "b", prompt) == 2 * CHUNK
    h2.run()
    h2.worker.shutdown()
    after = lines(trace)
    assert set(first) < set(after)  # appended to, never truncated
    b = after["b"]
    assert [c["from"] for c in b["chunks"]] == ["ssd", "ssd", "failed", "computed", "computed"]
    assert [c["key"] for c in b["chunks"]] == keys_of(h2, "b") == keys_of(h, "a")
    assert b["tokens"]["ssd"] == 2 * CHUNK
    assert b["tokens"]["computed"] == len(prompt) - 2 * CHUNK
    assert b["resident_tokens"]["ssd"] == CHUNKS * CHUNK
    assert b["load"] == "async" and b["load_seconds"]["wall"] > 0
    times = h2.params["b"]["miniflex"]  # the load's times, as the request's params give them
    assert times["load_wall_s"] >= times["load_ssd_s"] > 0 and times["load_copy_s"] > 0
    assert times["load_wall_s"] - times["load_ssd_s"] >= times["load_wait_s"]


def test_a_load_that_waited_for_kv_space_reports_the_wait_as_queued(tmp_path: Path) -> None:
    """A request whose hit waits for vLLM's KV space (another request holds it) reports
    the wait from its first lookup to its allocation as ``load_queued_s``; the load's own
    times start at the allocation."""
    prompt_blocks = -(-len(tokens(0)) // BLOCK)
    h = make_harness(
        tmp_path / "model", cpu_bytes=str(16 * SLOT), max_batched=2 * CHUNK, num_blocks=16
    )
    assert 2 * prompt_blocks > 16  # the hog and the hit cannot hold blocks at once
    h.cached_in_miniflex_only("a", tokens(0))
    h.add("hog", tokens(1), max_tokens=12)
    h.step()
    h.add("b", tokens(0), max_tokens=2)
    paused = 0.0
    while "b" not in h.params:
        scheduled = {r.req_id for r in h.step().scheduled_new_reqs}
        if "b" in scheduled or "b" in h.params:
            continue
        time.sleep(0.05)  # each step while b waits for blocks
        paused += 0.05
    h.run()
    b = h.params["b"]["miniflex"]
    assert b["hit_tokens"] == CHUNKS * CHUNK and b["load"] == "async"
    assert paused >= 0.2, "b never waited for KV space"
    assert b["load_queued_s"] >= paused / 2  # the steps before the hog's prefill ended too


def test_a_trace_file_that_cannot_be_opened_is_refused_by_name(tmp_path: Path) -> None:
    from miniflex.config import MiniFlexConfig
    from miniflex.errors import ConfigError
    from miniflex.keys import Namespace
    from miniflex.scheduler.trace import RequestTrace

    (tmp_path / "a-directory").mkdir()
    config = MiniFlexConfig.from_dict({"trace_file": str(tmp_path / "a-directory")})
    ns = Namespace("m", "bfloat16", "LBHNC", 2, 2, 64, 16, 2)
    with pytest.raises(ConfigError, match=r"trace_file.*a-directory"):
        RequestTrace(config.trace_file, ns)
