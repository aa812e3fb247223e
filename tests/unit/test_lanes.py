"""Lane: one medium pair's queue and thread, items run in submission order."""

from __future__ import annotations

import threading

from miniflex.worker.lanes import Lane


def recording(name: str = "test") -> tuple[Lane[int], list[tuple[int, str]], list[int]]:
    """A lane that records each item with the thread that ran it, and each failed item."""
    ran: list[tuple[int, str]] = []
    failed: list[int] = []

    def run(item: int) -> None:
        if item < 0:
            raise ValueError(f"bad item {item}")
        ran.append((item, threading.current_thread().name))

    lane = Lane[int](name, run, lambda item, exc: failed.append(item))
    return lane, ran, failed


def test_items_run_in_submission_order_on_the_lanes_own_thread() -> None:
    lane, ran, _ = recording("gpu-load")
    lane.start()
    for i in range(50):
        lane.submit(i)
    lane.wait()
    assert [i for i, _ in ran] == list(range(50))
    assert {name for _, name in ran} == {"miniflex-gpu-load"}
    lane.close()


def test_items_submitted_before_start_wait_for_it() -> None:
    lane, ran, _ = recording()
    lane.submit(1)
    lane.submit(2)
    assert ran == []
    lane.start()
    lane.wait()
    assert [i for i, _ in ran] == [1, 2]
    lane.close()


def test_an_item_that_raises_is_failed_and_the_lane_goes_on() -> None:
    lane, ran, failed = recording()
    lane.start()
    for i in (1, -2, 3):
        lane.submit(i)
    lane.wait()
    assert failed == [-2]
    assert [i for i, _ in ran] == [1, 3]
    lane.close()


def test_a_failing_fail_does_not_stop_the_lane() -> None:
    ran: list[int] = []

    def run(item: int) -> None:
        if item == 0:
            raise RuntimeError("run")
        ran.append(item)

    def fail(item: int, exc: Exception) -> None:
        raise RuntimeError("fail too")

    lane = Lane[int]("test", run, fail)
    lane.start()
    for i in (0, 1):
        lane.submit(i)
    lane.wait()
    assert ran == [1]
    lane.close()


def test_close_runs_what_is_queued_and_stops_the_thread() -> None:
    gate = threading.Event()
    ran: list[int] = []

    def run(item: int) -> None:
        gate.wait(5)
        ran.append(item)

    lane = Lane[int]("test", run, lambda item, exc: None)
    lane.start()
    for i in range(3):
        lane.submit(i)
    gate.set()
    lane.close()
    assert ran == [0, 1, 2]
    assert not any(t.name == "miniflex-test" for t in threading.enumerate())


def test_take_cpu_counts_the_runs_cpu_time_once() -> None:
    def spin(item: int) -> None:
        total = 0
        for i in range(200_000):
            total += i

    lane = Lane[int]("test", spin, lambda item, exc: None)
    lane.start()
    lane.submit(0)
    lane.wait()
    assert lane.take_cpu() > 0
    assert lane.take_cpu() == 0
    lane.close()
