"""Crashes users report against other offloading connectors, replayed against vLLM's real
Scheduler with MiniFlex: each ends served, with no pin, slot or job left and every vLLM
block free again.

- many requests for one prefix at once while that prefix is still being stored;
- many requests for one prefix at once while it loads, some aborted mid-load;
- a request aborted while its load waits behind another's (vLLM #49118);
- the loads of a burst failing, so every one of those requests recomputes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm.v1.request import RequestStatus

from tests.connector.engine_config import tokens
from tests.connector.harness import BLOCK, Harness, make_harness

CHUNK = 2 * BLOCK
BURST = 8


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return make_harness(tmp_path / "model", num_blocks=128, max_batched=4096)


def idle(h: Harness, total: int) -> bool:
    """Nothing pinned or moving in MiniFlex, no job or request tracked, every vLLM block
    free, and vLLM's own request table empty."""
    status = h.manager_side.manager.status()
    pinned = sum(t["pinned_or_moving"] for t in status["tiers"])
    return (
        pinned == 0
        and status["jobs_in_flight"] == 0
        and status["requests_tracked"] == 0
        and h.free_blocks() == total
        and not h.sched.requests
    )


def test_a_burst_on_a_prefix_still_being_stored(h: Harness) -> None:
    total = h.free_blocks()
    prefix = tokens(11, 4 * CHUNK)
    h.mover.gate.clear()  # a's stores stay in flight
    h.add("a", prefix + tokens(12, 5), max_tokens=1)
    h.step(wait_transfers=False)
    reqs = [h.add(f"b{i}", prefix + tokens(20 + i, 7), max_tokens=2) for i in range(BURST)]
    for _ in range(3):
        h.step(wait_transfers=False)
    h.mover.gate.set()
    h.run()
    assert all(r.status == RequestStatus.FINISHED_LENGTH_CAPPED for r in reqs)
    assert idle(h, total)


def test_a_burst_loading_one_prefix_with_aborts_mid_load(h: Harness) -> None:
    prefix = tokens(31, 4 * CHUNK)
    total = h.cached_in_miniflex_only("a", prefix + tokens(32, 3))
    h.mover.gate.clear()  # every load hangs mid-flight
    reqs = [h.add(f"b{i}", prefix + tokens(40 + i, 9), max_tokens=2) for i in range(BURST)]
    h.step(wait_transfers=False)
    waiting = [r for r in reqs if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS]
    assert waiting, "no request waited for its load"
    aborted = [r.request_id for r in reqs[::2]]
    h.sched.finish_requests(aborted, RequestStatus.FINISHED_ABORTED)
    h.step(wait_transfers=False)
    h.mover.gate.set()
    h.run()
    done = {r.request_id: r.status for r in reqs}
    assert all(done[r] == RequestStatus.FINISHED_ABORTED for r in aborted)
    served = [r for r in reqs if r.request_id not in aborted]
    assert all(r.status == RequestStatus.FINISHED_LENGTH_CAPPED for r in served)
    assert idle(h, total)


def test_an_abort_while_queued_behind_a_load_that_has_not_started(h: Harness) -> None:
    """vLLM #49118: a request whose load is planned but not begun (the worker busy with
    another's) is aborted."""
    prefix = tokens(51, 3 * CHUNK)
    total = h.cached_in_miniflex_only("a", prefix + tokens(52, 3))
    h.mover.gate.clear()  # b's load holds the mover; c's waits behind it
    first = h.add("b", prefix + tokens(53, 5), max_tokens=2)
    queued = h.add("c", prefix + tokens(54, 5), max_tokens=2)
    h.step(wait_transfers=False)
    assert queued.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    h.sched.finish_requests(["c"], RequestStatus.FINISHED_ABORTED)
    h.step(wait_transfers=False)
    h.mover.gate.set()
    h.run()
    assert queued.status == RequestStatus.FINISHED_ABORTED
    assert first.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert idle(h, total)


def test_a_burst_whose_loads_fail_is_recomputed(h: Harness) -> None:
    prefix = tokens(61, 4 * CHUNK)
    total = h.cached_in_miniflex_only("a", prefix + tokens(62, 3))
    h.mover.fail_loads = BURST  # every load job of the burst raises
    reqs = [h.add(f"b{i}", prefix + tokens(70 + i, 9), max_tokens=2) for i in range(BURST)]
    h.run()
    assert all(r.status == RequestStatus.FINISHED_LENGTH_CAPPED for r in reqs)
    assert h.load_errors > 0  # vLLM was told, and recomputed those blocks
    assert idle(h, total)
    served = h.add("z", prefix + tokens(99, 9), max_tokens=2)  # the tier still serves
    h.run()
    assert served.status == RequestStatus.FINISHED_LENGTH_CAPPED and idle(h, total)
