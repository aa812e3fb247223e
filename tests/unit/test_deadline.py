"""DeadlineCalls and StagingPool: calls bounded in time, buffers a late call keeps."""

from __future__ import annotations

import threading
import time

import pytest

from miniflex.remote.deadline import CallTimeout, DeadlineCalls, StagingPool, TooManyLate


def test_a_call_that_ends_in_time_gives_its_result_or_its_exception() -> None:
    calls = DeadlineCalls()
    assert calls.run(lambda: 7, 1.0) == 7
    with pytest.raises(KeyError):
        calls.run(lambda: {}["missing"], 1.0)
    assert calls.late == 0


def test_a_late_call_hands_its_buffers_back_only_when_it_ends() -> None:
    calls, gate, given = DeadlineCalls(), threading.Event(), threading.Event()
    with pytest.raises(CallTimeout):
        calls.run(gate.wait, 0.05, on_late=given.set)
    assert calls.late == 1 and not given.is_set()  # still running: its buffer is its own
    gate.set()
    assert given.wait(5.0)
    deadline = time.monotonic() + 5.0
    while calls.late and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls.late == 0


def test_past_max_late_calls_no_new_call_starts() -> None:
    calls, gate, ran = DeadlineCalls(max_late=1), threading.Event(), []
    with pytest.raises(CallTimeout):
        calls.run(gate.wait, 0.05)
    with pytest.raises(TooManyLate):
        calls.run(lambda: ran.append(1), 1.0)
    assert ran == []
    gate.set()


def test_the_staging_pool_reuses_the_smallest_buffer_that_fits() -> None:
    pool = StagingPool()
    small, big = pool.take(100), pool.take(200 << 10)
    assert small.size == 64 << 10 and big.size == 256 << 10  # 64 KiB steps
    assert pool.allocated == (64 << 10) + (256 << 10)
    pool.give(big)
    pool.give(small)
    assert pool.take(10 << 10) is small
    assert pool.take(70 << 10) is big
    assert pool.allocated == (64 << 10) + (256 << 10)  # nothing new
    pool.give(small)
    assert pool.clear() == [small] and pool.allocated == 256 << 10
