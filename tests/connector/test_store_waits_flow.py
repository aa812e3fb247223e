"""Stores of prompts larger than the CPU tier, over an SSD tier, inside vLLM's real Scheduler.

A prompt of 15 chunks is computed in one step over a CPU tier of 4 slots. Every chunk
must reach the SSD tier: the chunks that find no CPU slot (all pinned while their
neighbours are written) wait for one, step after step, and vLLM keeps the finished
request's blocks until the last of them is stored. Then the whole prompt loads back
from the tiers, bit for bit.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from vllm.v1.request import RequestStatus

from miniflex.keys import chunk_key
from miniflex.plan import JobKind
from miniflex.scheduler import store_planner
from miniflex.types import ReqId
from tests.connector.engine_config import tokens as prompt_tokens
from tests.connector.harness import BLOCK, Harness, make_harness
from tests.connector.stats_sum import prometheus_values, summed_stats, totals

CHUNK = 2 * BLOCK
SLOT = 4096  # the harness's chunk: 2 layers x 2 blocks x 1 KiB pages
LONG = 15


@pytest.fixture
def ssd(direct_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # the same block hashes in every harness
    return direct_dir


def harness(tmp_path: Path, ssd: Path | None, **extra: object) -> Harness:
    tier = {"ssd_dirs": str(ssd), "ssd_bytes": str(64 * SLOT)} if ssd is not None else {}
    return make_harness(
        tmp_path / "model",
        num_blocks=96,
        cpu_bytes=str(4 * SLOT),
        max_batched=(LONG + 1) * CHUNK,  # the whole prompt in one step
        extra={"hit_policy": "load", **tier, **extra},
    )


def prompt(seed: int) -> list[int]:
    return prompt_tokens(seed, LONG * CHUNK + 10)


def reload(h: Harness, req_id: str, tokens: list[int]) -> int:
    """Serve ``tokens`` again with vLLM's copy dropped; the tokens MiniFlex loaded (checked
    byte for byte by the harness)."""
    assert h.sched.reset_prefix_cache()
    return h.serve(req_id, tokens, steps=8)


@pytest.mark.parametrize("mode", ["through", "back"])
def test_every_chunk_of_a_prompt_larger_than_the_cpu_tier_reaches_ssd(
    tmp_path: Path, ssd: Path, mode: str
) -> None:
    h = harness(tmp_path, ssd, ssd_write=mode, prefill_tokens_per_s=100)
    total = h.free_blocks()
    h.add("a", prompt(1), max_tokens=2)
    h.run()
    assert h.finished_and_freed("a") and h.free_blocks() == total
    t = totals(h.kv_stats)
    assert t.get("stores_skipped", 0) == 0
    manager = h.manager_side.manager
    assert manager.ssd is not None and len(manager.ssd) >= LONG - 4  # the CPU tier has the rest
    assert not manager.has_jobs() and manager.cpu.usage().pinned_or_moving == 0
    assert reload(h, "again", prompt(1)) == LONG * CHUNK
    # write-back writes a chunk when the CPU tier evicts it: the last ones are in CPU only
    # (a load does not store what it read from SSD again, which would evict them)
    hashes = h.requests["a"].block_hashes
    keys = [chunk_key(manager.ns, bytes(hashes[(i + 1) * CHUNK // BLOCK - 1])) for i in range(LONG)]
    on_disk = manager.ssd.match(keys)  # the prompt's leading chunks on SSD
    assert (on_disk == LONG) if mode == "through" else (on_disk >= LONG - 4)
    h.shutdown()

    restarted = harness(tmp_path, ssd, ssd_write=mode)
    assert reload(restarted, "after", prompt(1)) == on_disk * CHUNK
    assert totals(restarted.kv_stats)["hit_tokens_ssd"] == on_disk * CHUNK
    restarted.shutdown()


def test_without_an_ssd_tier_what_finds_no_slot_is_dropped_at_once(tmp_path: Path) -> None:
    """No tier below: nothing waits, the finished request's blocks go back at once."""
    h = harness(tmp_path, None)
    h.add("a", prompt(2), max_tokens=2)
    h.run()
    assert totals(h.kv_stats)["stores_skipped"] == LONG - 4
    assert not h.manager_side.manager.has_jobs()
    h.shutdown()


def test_chunks_wait_for_a_slot_no_longer_than_the_limit(
    tmp_path: Path, ssd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_planner, "STORE_WAIT_S", 0.0)
    h = harness(tmp_path, ssd, ssd_write="through")
    h.add("a", prompt(3), max_tokens=2)
    h.run()
    assert totals(h.kv_stats)["stores_skipped"] == LONG - 4
    assert h.finished_and_freed("a") and not h.manager_side.manager.has_jobs()
    h.shutdown()


def test_a_request_preempted_while_its_chunks_wait_stores_none_of_its_freed_blocks(
    tmp_path: Path, ssd: Path
) -> None:
    """vLLM frees a preempted request's blocks: its chunks that waited for a CPU slot must not
    be stored from them, even when it is aborted before it computes again. The prompt's
    chunks that were stored are served, byte for byte, and nothing stays held."""
    h = harness(tmp_path, ssd, ssd_write="through")
    total = h.free_blocks()
    h.add("a", prompt(4), max_tokens=20)
    h.step()  # the whole prompt in one step: 4 chunks placed, the rest wait
    st = h.manager_side.manager.state_for(ReqId("a"))
    assert st.store_waits and st.stored_chunks < LONG
    stored = st.stored_chunks
    assert h.sched.reset_prefix_cache(reset_running_requests=True)  # preempts "a"
    h.sched.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    plans = []
    while h.sched.requests or h.manager_side.has_pending_push_work():
        so = h.step()
        plans.append(so.kv_connector_metadata.plan)
        assert len(plans) < 50
    stores = [j for p in plans for j in p.jobs if j.kind is JobKind.STORE]
    assert all(c.block_ids for j in stores for c in j.chunks)  # never a chunk of no blocks
    assert sum(len(j.chunks) for j in stores) <= LONG - stored
    assert h.finished_and_freed("a") and h.free_blocks() == total
    assert not h.manager_side.manager.has_jobs()
    reload(h, "again", prompt(4))  # whatever it loads is checked byte for byte
    h.shutdown()


def test_a_finished_request_is_released_after_the_plan_of_its_last_store(
    tmp_path: Path, ssd: Path
) -> None:
    """With a drafter vLLM asks a worker what finished before it hands over the plan's stores,
    so a release must never ride in the plan of a store of the same request."""
    h = harness(tmp_path, ssd, ssd_write="through")
    h.add("a", prompt(5), max_tokens=2)
    plans = []
    while h.sched.requests or h.manager_side.has_pending_push_work():
        plans.append(h.step().kv_connector_metadata.plan)
        assert len(plans) < 100
    released = [i for i, p in enumerate(plans) if "a" in p.release]
    stored = [i for i, p in enumerate(plans) for j in p.jobs if j.req_id == "a"]
    assert len(released) == 1 and stored and max(stored) < released[0]
    assert totals(h.kv_stats).get("stores_skipped", 0) == 0
    h.shutdown()


def test_how_long_vllm_kept_a_finished_requests_blocks_is_counted(
    tmp_path: Path, ssd: Path
) -> None:
    """The seconds from a request's finish until vLLM got its blocks back (its chunks waited
    for CPU slots meanwhile) reach vLLM's stats and ``/metrics``, once per held request."""
    h = harness(tmp_path, ssd, ssd_write="through")
    h.add("a", prompt(6), max_tokens=2)
    for _ in range(100):  # until "a" has finished and MiniFlex still holds its blocks
        h.step()
        if RequestStatus.is_finished(h.status("a")):
            break
    assert h.finished_and_freed("a") is False  # vLLM keeps them for MiniFlex
    time.sleep(0.3)  # held all along
    h.run()
    assert h.finished_and_freed("a")
    t = totals(h.kv_stats)
    assert t["blocks_held_requests"] == 1
    assert 0.3 <= t["blocks_held_seconds"] < 30
    assert summed_stats(h.kv_stats).reduce()["blocks_held_ms_avg"] >= 300
    value = prometheus_values(h.kv_stats, h.sched.vllm_config)
    assert value("vllm:miniflex_blocks_held_requests_total") == 1
    assert value("vllm:miniflex_blocks_held_seconds_total") == t["blocks_held_seconds"]
    h.shutdown()
