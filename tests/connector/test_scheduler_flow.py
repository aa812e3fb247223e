"""MiniFlex inside vLLM's real Scheduler: async loads, aborts, preemption, delayed frees."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import RequestStatus

from miniflex.keys import chunk_key
from miniflex.types import ReqId
from tests.connector.engine_config import tokens
from tests.connector.harness import BLOCK, HEAD, HEADS, LAYERS, Harness, make_harness
from tests.connector.stats_sum import summed_stats, totals

CHUNK = 2 * BLOCK


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return make_harness(tmp_path / "model")


def pinned(h: Harness) -> int:
    return h.manager_side.manager.cpu.usage().pinned_or_moving


def test_async_load_restores_exact_bytes_then_computes_the_rest(h: Harness) -> None:
    prompt = tokens(1, 5 * CHUNK + 10)
    total = h.cached_in_miniflex_only("a", prompt)

    b = h.add("b", prompt, max_tokens=2)
    so = h.step(wait_transfers=False)
    assert so.num_scheduled_tokens == {}  # nothing to compute while KV is loading
    assert h.status("b") == RequestStatus.WAITING_FOR_REMOTE_KVS
    h.worker.handler.drain()
    h.step()  # the load's completion reaches the scheduler
    so = h.step()  # b is scheduled with the loaded prefix as computed
    assert {r.req_id: r.num_computed_tokens for r in so.scheduled_new_reqs} == {"b": 5 * CHUNK}
    assert h.loaded_blocks_match(b, 5 * CHUNK // BLOCK)
    h.run()
    assert pinned(h) == 0 and h.free_blocks() == total

    # what vLLM's stats loggers receive, rebuilt and summed as its logging process does
    stats = summed_stats(h.kv_stats)
    assert stats.data["hit_tokens_cpu"] == 5 * CHUNK
    assert stats.data["stored_tokens"] == 5 * CHUNK  # a's chunks; b's were already there
    assert stats.data["loads"] == 1 and stats.data["failed_jobs"] == 0
    page_bytes = HEADS * BLOCK * 2 * HEAD * 2  # fp16
    assert stats.data["load_bytes"] == (5 * CHUNK // BLOCK) * LAYERS * page_bytes
    summary = stats.reduce()
    assert summary["hit_tokens_cpu"] == 5 * CHUNK and summary["load_ms_avg"] > 0


def test_lookup_is_side_effect_free_and_capped_below_the_prompt(h: Harness) -> None:
    prompt = tokens(2, 4 * CHUNK)  # a whole number of chunks
    h.cached_in_miniflex_only("a", prompt)
    conn = h.manager_side
    b = h.add("b", prompt)
    first = conn.get_num_new_matched_tokens(b, 0)
    assert first == conn.get_num_new_matched_tokens(b, 0)  # repeatable, nothing pinned
    assert pinned(h) == 0
    assert first == (4 * CHUNK - BLOCK, True)  # the last token is always computed
    h.step()  # the load runs and completes; b is not computed yet
    assert h.loaded_blocks_match(b, 4 * CHUNK // BLOCK - 1)
    h.run()


def test_abort_while_waiting_for_load_releases_pins_and_blocks(h: Harness) -> None:
    prompt = tokens(3, 4 * CHUNK + 5)
    total = h.cached_in_miniflex_only("a", prompt)
    held = totals(h.kv_stats)["blocks_held_requests"]  # a's, for its stores
    h.mover.gate.clear()  # the load will hang mid-flight
    h.add("b", prompt)
    h.step(wait_transfers=False)
    assert pinned(h) == 4
    h.sched.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    h.step(wait_transfers=False)
    assert not h.finished_and_freed("b")  # blocks stay until the load lets go of them
    h.mover.gate.set()
    h.run()
    assert h.finished_and_freed("b") and pinned(h) == 0 and h.free_blocks() == total
    assert totals(h.kv_stats)["blocks_held_requests"] == held + 1  # ended by finished_recving


def test_request_finishing_with_save_in_flight_keeps_blocks_until_saved(h: Harness) -> None:
    prompt = tokens(4, 3 * CHUNK + 3)
    total = h.free_blocks()
    h.mover.gate.clear()
    h.add("a", prompt, max_tokens=1)
    h.step(wait_transfers=False)  # prefill + sample: finished, its stores still queued
    assert h.status("a") == RequestStatus.FINISHED_LENGTH_CAPPED
    assert not h.finished_and_freed("a") and h.free_blocks() < total
    assert h.manager_side.has_pending_block_frees()
    h.step(wait_transfers=False)
    assert not h.finished_and_freed("a")
    h.mover.gate.set()
    h.run()
    assert h.finished_and_freed("a") and h.free_blocks() == total
    b = h.add("b", prompt)
    assert h.manager_side.get_num_new_matched_tokens(b, 0)[0] == 3 * CHUNK


def test_preempted_request_stores_finish_before_its_blocks_are_reused(tmp_path: Path) -> None:
    """Stores hang until a preemption frees their blocks; the worker must wait for them."""
    h = make_harness(tmp_path / "model", num_blocks=12, max_batched=64)
    total = h.free_blocks()
    a = h.add("a", tokens(5, 4 * BLOCK), max_tokens=5 * BLOCK)
    b = h.add("b", tokens(6, 4 * BLOCK), max_tokens=5 * BLOCK)
    h.mover.gate.clear()
    seen: list[tuple[str, bool]] = []

    def around_preemption(so: SchedulerOutput) -> None:
        gone = set(so.preempted_req_ids or ())
        if not gone:
            return
        pending = {r for r in gone if h.worker.handler.in_flight(r)}
        if h.mover.gate.is_set():  # second call: after handle_preemptions returned
            seen.extend((r, h.worker.handler.in_flight(r) > 0) for r in gone)
            h.mover.gate.clear()
        elif pending:  # first call: stores of the preempted request are stuck in flight
            threading.Timer(0.3, h.mover.gate.set).start()

    for _ in range(400):
        h.step(wait_transfers=False, on_schedule=around_preemption)
        if seen or not h.sched.requests:
            break
    h.mover.gate.set()
    h.run()
    assert seen and all(not still_pending for _, still_pending in seen)
    assert a.status == b.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert pinned(h) == 0 and h.free_blocks() == total


def test_request_preempted_and_resumed_in_one_step_stores_the_right_blocks(
    tmp_path: Path,
) -> None:
    """reset_prefix_cache(reset_running_requests=True) preempts running requests, and the
    next step resumes them with a new block table; stores must follow the new table."""
    h = make_harness(tmp_path / "model", max_batched=2 * CHUNK)  # chunked prefill
    prompt = tokens(8, 6 * CHUNK + 3)
    h.add("a", prompt)
    h.step()  # first two chunks computed
    assert h.sched.reset_prefix_cache(reset_running_requests=True)
    h.run()
    h.sched.reset_prefix_cache()
    b = h.add("b", prompt)
    h.step()  # the load runs; b is not computed yet
    assert h.loaded_blocks_match(b, 6 * CHUNK // BLOCK)


def test_keys_follow_block_hashes_that_vllm_rewrites(tmp_path: Path) -> None:
    """Streaming-input sessions replace a prompt's tail hashes: stale keys must go."""
    h = make_harness(tmp_path / "model")
    manager = h.manager_side.manager
    old = [bytes([i]) * 32 for i in range(8)]  # 4 chunks of 2 blocks
    manager.lookup(ReqId("r"), old, 8 * BLOCK + 1, 0)
    st = manager.state_for(ReqId("r"))
    st.stored_chunks = 4
    before = list(st.keys)
    # one key per chunk, from the hash of the chunk's last block
    assert before == [chunk_key(manager.ns, old[i]) for i in (1, 3, 5, 7)]
    new = [*old[:5], b"x" * 32, b"y" * 32, b"z" * 32]  # blocks 5.. changed: chunks 2, 3
    manager.lookup(ReqId("r"), new, 8 * BLOCK + 1, 0)
    assert st.keys[:2] == before[:2] and st.keys[2:] != before[2:] and len(st.keys) == 4
    assert st.stored_chunks == 2  # chunks 2 and 3 will be stored again, under new keys
    assert len(st.keys.array) == 4
    manager.lookup(ReqId("r"), new[:3], 3 * BLOCK + 1, 0)  # shrunk below a chunk boundary
    assert list(st.keys) == before[:1] and st.stored_chunks == 1
