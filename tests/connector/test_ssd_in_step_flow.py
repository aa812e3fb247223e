"""Loads inside a step that read SSD chunks, in vLLM's real Scheduler.

A prompt pushed out of the CPU tier onto SSD is loaded inside the step that
computes the rest of it (``load_mode`` sync or layerwise): its chunks are read
into CPU slots while the forward runs, and each layer is copied once its bytes
are in. The harness's mover lands a layer only when it is waited for, and its
stand-in model makes every page a function of its prefix, so what the forward
read is checked bit for bit.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from vllm.v1.request import RequestStatus

from miniflex.plan import JobKind, LoadTiming
from miniflex.ssd.store import DATA_FILE, rank_dirs
from tests.connector.engine_config import tokens as prompt_tokens
from tests.connector.harness import BLOCK, Harness, make_harness
from tests.connector.stats_sum import totals as summed_totals

CHUNK = 2 * BLOCK
CHUNKS = 5
SLOT = 4096  # the harness's chunk: 2 layers x 2 blocks x 1 KiB pages


def tokens(seed: int) -> list[int]:
    return prompt_tokens(seed, CHUNKS * CHUNK + 10)


def harness(tmp_path: Path, ssd: Path, **extra: object) -> Harness:
    """A CPU tier of 8 chunks over an SSD tier; write-through, so every chunk is on SSD."""
    return make_harness(
        tmp_path / "model",
        cpu_bytes=str(8 * SLOT),
        max_batched=2 * CHUNK,
        load_mode=str(extra.pop("load_mode", "layerwise")),
        extra={
            "ssd_dirs": str(ssd),
            "ssd_bytes": str(64 * SLOT),
            "ssd_write": "through",
            "hit_policy": "load",
            **extra,
        },
    )


@pytest.fixture
def ssd(direct_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # the same block hashes after a restart
    return direct_dir


def on_ssd_only(tmp_path: Path, ssd: Path, seed: int, **extra: object) -> Harness:
    """A harness whose ``tokens(seed)`` is resident on SSD alone (written through, then a
    restart: the CPU tier starts empty)."""
    h = harness(tmp_path, ssd)
    h.cached_in_miniflex_only("a", tokens(seed))
    h.run()
    assert summed_totals(h.kv_stats)["demoted_chunks"] == CHUNKS
    h.worker.shutdown()
    h2 = harness(tmp_path, ssd, **extra)
    assert len(h2.manager_side.manager.ssd or ()) == CHUNKS
    assert len(h2.manager_side.manager.cpu) == 0
    return h2


@pytest.mark.parametrize("mode", ["layerwise", "sync"])
def test_ssd_chunks_load_inside_the_step_bit_exact(tmp_path: Path, ssd: Path, mode: str) -> None:
    h = on_ssd_only(tmp_path, ssd, 1, load_mode=mode)
    prompt = tokens(1)
    b = h.add("b", prompt, max_tokens=2)
    assert h.manager_side.get_num_new_matched_tokens(b, 0) == (CHUNKS * CHUNK, False)
    so = h.step()
    loads = [j for j in so.kv_connector_metadata.plan.jobs if j.kind is JobKind.LOAD]
    assert [(j.timing, len(j.promotions)) for j in loads] == [(LoadTiming(mode), CHUNKS)]
    assert {r.req_id: r.num_computed_tokens for r in so.scheduled_new_reqs} == {"b": CHUNKS * CHUNK}
    assert h.read_matches(b, CHUNKS * CHUNK // BLOCK)  # the forward read the SSD bytes
    h.run()
    assert b.status == RequestStatus.FINISHED_LENGTH_CAPPED
    t = summed_totals(h.kv_stats)
    assert t["hit_tokens_ssd"] == CHUNKS * CHUNK and t["promoted_chunks"] == CHUNKS
    assert t[f"loads_{mode}"] == 1 and t["failed_jobs"] == 0
    m = h.manager_side.manager
    assert m.cpu.usage().pinned_or_moving == 0 and len(m.cpu) == CHUNKS  # published in CPU
    h.worker.shutdown()


def test_a_corrupt_chunk_read_inside_a_step_is_recomputed(tmp_path: Path, ssd: Path) -> None:
    h = harness(tmp_path, ssd)
    h.cached_in_miniflex_only("a", tokens(2))
    h.run()
    h.worker.shutdown()
    path = os.path.join(rank_dirs([str(ssd)], 0)[0], DATA_FILE)
    with open(path, "r+b") as f:  # one byte of the third chunk (slots go out in order)
        f.seek(2 * SLOT + 100)
        byte = f.read(1)
        f.seek(2 * SLOT + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    h2 = harness(tmp_path, ssd)
    b = h2.add("b", tokens(2), max_tokens=2)
    so = h2.step()
    assert so.num_scheduled_tokens == {"b": 10}  # scheduled on the promise of the load
    assert b.num_computed_tokens == 2 * CHUNK  # vLLM rewound it to the corrupt chunk
    h2.run()
    assert b.status == RequestStatus.FINISHED_LENGTH_CAPPED
    t = summed_totals(h2.kv_stats)
    assert t["ssd_read_failures"] == 1 and t["hit_tokens_ssd"] == 2 * CHUNK
    assert h2.manager_side.manager.cpu.usage().pinned_or_moving == 0
    assert h2.sched.reset_prefix_cache()
    assert h2.serve("c", tokens(2)) == CHUNKS * CHUNK  # the recomputed chunks, stored anew
    h2.worker.shutdown()


def test_without_staging_slots_ssd_chunks_load_before_the_step(tmp_path: Path, ssd: Path) -> None:
    """A pool with no staging slots (``ssd_stream_bytes=0``, as a replicated cache's) reads
    no SSD inside a step: the same hit loads asynchronously, before the step."""
    h = on_ssd_only(tmp_path, ssd, 3, ssd_stream_bytes="0")
    assert h.serve("b", tokens(3)) == CHUNKS * CHUNK
    t = summed_totals(h.kv_stats)
    assert t["loads_async"] == 1 and t.get("loads_layerwise", 0) == 0
    assert t["hit_tokens_ssd"] == CHUNKS * CHUNK
    h.worker.shutdown()


def test_an_in_step_load_that_evicts_unwritten_chunks_keeps_them_right(
    tmp_path: Path, ssd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-step load's promotions evict chunks that are not on SSD yet: they are written
    back in the same plan, on a slow disk (the writes start after the reads), and what
    comes back of them later is their own bytes."""
    h = on_ssd_only(tmp_path, ssd, 4, ssd_write="back")
    for i in range(2):  # the CPU tier fills with chunks that are not on SSD yet
        h.cached_in_miniflex_only(f"fill{i}", tokens(10 + i))
    copier = h.worker.handler._ssd
    demote = copier.demote

    def slow_demote(copies):  # the disk is busy: the write starts after the reads would
        time.sleep(0.3)
        return demote(copies)

    monkeypatch.setattr(copier, "demote", slow_demote)
    t0 = summed_totals(h.kv_stats)["demoted_chunks"]
    assert h.serve("b", tokens(4), read=True) == CHUNKS * CHUNK  # checks what it read
    assert summed_totals(h.kv_stats)["demoted_chunks"] > t0  # evictions were written back
    loaded = []
    for i in range(2):  # what comes back of the fillers is right (serve checks the bytes)
        assert h.sched.reset_prefix_cache()
        loaded.append(h.serve(f"again{i}", tokens(10 + i)))
    assert sum(loaded) >= CHUNKS * CHUNK, loaded
    h.worker.shutdown()


def test_what_a_step_computed_over_a_failed_in_step_load_is_not_stored(
    tmp_path: Path, ssd: Path
) -> None:
    """Three chunks load from SSD inside the step that computes the next two; the second
    one is corrupt. Those two were computed over bytes that never arrived: their store is
    dropped (one failed job), and vLLM recomputes from the corrupt chunk, storing again."""
    h = harness(tmp_path, ssd)
    h.cached_in_miniflex_only("a", prompt_tokens(5, 3 * CHUNK + 10))
    h.run()
    h.worker.shutdown()
    path = os.path.join(rank_dirs([str(ssd)], 0)[0], DATA_FILE)
    with open(path, "r+b") as f:  # one byte of the second chunk
        f.seek(SLOT + 100)
        byte = f.read(1)
        f.seek(SLOT + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    h2 = harness(tmp_path, ssd)
    b = h2.add("b", prompt_tokens(5, 5 * CHUNK + 10), max_tokens=2)
    so = h2.step()
    assert so.num_scheduled_tokens == {"b": 2 * CHUNK}  # chunks 3 and 4, beside the load
    assert b.num_computed_tokens == CHUNK  # rewound to the corrupt chunk
    h2.run()
    assert b.status == RequestStatus.FINISHED_LENGTH_CAPPED
    t = summed_totals(h2.kv_stats)
    assert t["failed_jobs"] == 1 and t["ssd_read_failures"] == 1
    assert h2.manager_side.manager.cpu.usage().pinned_or_moving == 0
    assert h2.sched.reset_prefix_cache()
    assert h2.serve("c", prompt_tokens(5, 5 * CHUNK + 10)) == 5 * CHUNK  # all stored anew
    h2.worker.shutdown()
