"""Backfill: which waiting requests the lookup passes over, and for how long."""

from __future__ import annotations

import pytest

from miniflex.scheduler.backfill import MAX_PASSES_PER_STEP, Backfill


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def failed(b: Backfill, req_id: str, need: int) -> None:
    """One step in which vLLM asked ``req_id`` and did not admit it."""
    assert not b.passes_over(req_id, need)
    b.asked(req_id, need)
    b.end_step()


def test_a_request_that_did_not_fit_is_passed_over_and_one_that_fits_is_not() -> None:
    b = Backfill(5.0, Clock())
    failed(b, "cold", 260)
    assert b.passes_over("cold", 260)
    assert not b.passes_over("shares-prefix", 8)  # fewer blocks than what failed: tried
    b.asked("shares-prefix", 8)
    b.admitted("shares-prefix")
    b.end_step()
    assert b.num_waiting == 1


def test_a_request_as_big_as_one_that_failed_is_passed_over_untried() -> None:
    b = Backfill(5.0, Clock())
    failed(b, "a", 200)
    assert b.passes_over("b", 260) and b.passes_over("c", 200)  # in one step, no try each
    assert b.num_waiting == 3


def test_room_lets_the_oldest_try_again_once() -> None:
    b = Backfill(5.0, Clock())
    failed(b, "a", 200)
    assert b.passes_over("b", 200)  # untried: as big as "a"
    b.room()
    assert b.passes_over("b", 200)  # the room goes to the oldest first
    assert not b.passes_over("a", 200)  # its one retry
    b.asked("a", 200)
    b.end_step()  # failed again
    assert b.passes_over("a", 200) and b.passes_over("b", 200)
    b.room(times=2)
    assert not b.passes_over("b", 200) and not b.passes_over("a", 200)


def test_a_request_whose_prefix_reached_the_gpu_is_tried_before_any_room() -> None:
    b = Backfill(5.0, Clock())
    failed(b, "cold", 260)
    assert b.passes_over("cold", 260)
    assert not b.passes_over("cold", 8)  # its prefix is on the GPU now: 8 blocks
    b.asked("cold", 8)
    b.end_step()  # even 8 did not fit
    assert b.passes_over("cold", 8)  # its need is now 8: not tried again every step
    assert b.passes_over("new", 8)


def test_wait_s_bounds_the_wait_then_the_request_holds_the_queue() -> None:
    clock = Clock()
    b = Backfill(5.0, clock)
    failed(b, "a", 200)
    clock.t += 4.9
    assert b.passes_over("a", 200)
    clock.t += 0.2
    assert not b.passes_over("a", 200) and not b.passes_over("a", 200)
    b.asked("a", 200)
    b.end_step()
    assert not b.passes_over("a", 200)  # still tried: first failure counts, not the last


def test_admitted_and_forgotten_requests_leave() -> None:
    b = Backfill(5.0, Clock())
    failed(b, "a", 200)
    failed(b, "b", 100)
    b.admitted("a")
    b.forget("b")
    assert b.num_waiting == 0


def test_zero_is_vllms_own_order() -> None:
    b = Backfill(0.0, Clock())
    failed(b, "a", 200)
    assert not b.passes_over("a", 200) and not b.passes_over("b", 300)
    assert b.num_waiting == 0 and not b.enabled
    with pytest.raises(ValueError, match="wait_s"):
        Backfill(-1.0)


def test_a_step_passes_over_at_most_max_passes_per_step() -> None:
    b = Backfill(5.0, Clock())
    failed(b, "a", 10)
    passed = [b.passes_over(f"r{i}", 20) for i in range(MAX_PASSES_PER_STEP + 2)]
    assert passed == [True] * MAX_PASSES_PER_STEP + [False, False]  # the rest are tried
    b.end_step()
    assert b.passes_over("r0", 20) and b.passes_over("a", 10)  # a new step
