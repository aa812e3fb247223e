"""``Completions`` alone: which requests vLLM hears are finished, and when."""

from __future__ import annotations

import threading
import time

from miniflex.plan import JobId, JobKind, JobResult
from miniflex.types import BlockId, ReqId
from miniflex.worker.completions import Completions


def _res(job: int, req: str, kind: JobKind, failed: tuple[int, ...] = ()) -> JobResult:
    blocks = tuple(BlockId(b) for b in failed)
    return JobResult(JobId(job), ReqId(req), kind, not failed, failed_block_ids=blocks)


def test_a_released_request_is_finished_sending_only_once_all_its_jobs_are_done() -> None:
    done = Completions()
    store1, store2 = done.track(ReqId("a")), done.track(ReqId("a"))
    done.release_when_done([ReqId("a")])
    assert done.poll() == (set(), set()) and done.in_flight(ReqId("a")) == 2
    store1.set_result(_res(1, "a", JobKind.STORE))
    assert done.poll() == (set(), set()) and done.in_flight(ReqId("a")) == 1
    store2.set_result(_res(2, "a", JobKind.STORE))
    assert done.poll() == ({"a"}, set())
    assert done.poll() == (set(), set())  # said once
    assert [r.job_id for r in done.take_results()] == [1, 2] and not done.take_results()


def test_a_request_released_with_no_jobs_is_finished_at_the_next_poll() -> None:
    done = Completions()
    done.release_when_done([ReqId("idle")])
    assert done.poll() == ({"idle"}, set())


def test_finished_loads_are_receiving_and_their_failed_blocks_are_load_errors() -> None:
    done = Completions()
    ok, bad, store = done.track(ReqId("a")), done.track(ReqId("b")), done.track(ReqId("c"))
    ok.set_result(_res(1, "a", JobKind.LOAD))
    bad.set_result(_res(2, "b", JobKind.LOAD, failed=(7, 9)))
    store.set_result(_res(3, "c", JobKind.STORE, failed=(11,)))  # a store's blocks: not loads
    done.add(_res(4, "d", JobKind.LOAD, failed=(13,)))  # an in-step load, reported directly
    assert done.poll() == (set(), {"a", "b"})  # the in-step load: never finished-receiving
    assert done.take_load_errors() == ({7, 9, 13}, {"b", "d"})
    assert done.take_load_errors() == (set(), set())
    assert sorted(r.job_id for r in done.take_results()) == [1, 2, 3, 4]


def test_wait_for_blocks_until_the_requests_jobs_are_resolved_on_another_thread() -> None:
    done = Completions()
    fut, other = done.track(ReqId("a")), done.track(ReqId("b"))
    timer = threading.Timer(0.2, lambda: fut.set_result(_res(1, "a", JobKind.STORE)))
    t0 = time.perf_counter()
    timer.start()
    done.wait_for([ReqId("a")])  # not b's
    assert time.perf_counter() - t0 >= 0.15 and fut.done() and not other.done()
    other.set_result(_res(2, "b", JobKind.STORE))
    done.drain()
    assert done.in_flight(ReqId("a")) == 0 and done.in_flight(ReqId("b")) == 0
