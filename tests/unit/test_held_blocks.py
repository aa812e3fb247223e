"""``HeldBlocks``: how long vLLM kept each finished request's blocks for MiniFlex."""

from __future__ import annotations

from miniflex.connector.held_blocks import HeldBlocks
from miniflex.types import ReqId


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_hold_runs_from_its_finish_to_its_release() -> None:
    clock = Clock()
    held = HeldBlocks(clock)
    held.hold(ReqId("a"))
    clock.now += 2.0
    held.hold(ReqId("b"))
    clock.now += 0.5
    n, seconds = held.released({ReqId("a"), ReqId("b")})
    assert n == 2 and seconds == 2.5 + 0.5
    assert len(held) == 0


def test_requests_not_held_are_ignored_and_a_hold_ends_once() -> None:
    clock = Clock()
    held = HeldBlocks(clock)
    held.hold(ReqId("a"))
    clock.now += 1.0
    assert held.released({ReqId("running-load")}) == (0, 0.0)  # a load's finished_recving
    assert len(held) == 1
    assert held.released([ReqId("a")]) == (1, 1.0)
    assert held.released([ReqId("a")]) == (0, 0.0)  # reported again: not counted twice


def test_a_request_finished_again_restarts_its_hold() -> None:
    """vLLM reuses no request id while its blocks are held; a later request of the same id
    is a new hold, timed from its own finish."""
    clock = Clock()
    held = HeldBlocks(clock)
    held.hold(ReqId("a"))
    clock.now += 3.0
    held.released([ReqId("a")])
    clock.now += 10.0
    held.hold(ReqId("a"))
    clock.now += 0.25
    assert held.released([ReqId("a")]) == (1, 0.25)


def test_a_second_hold_of_a_held_request_keeps_the_first_start() -> None:
    """Several KV cache groups may each start the hold of one request: counted once, from
    the first."""
    clock = Clock()
    held = HeldBlocks(clock)
    held.hold(ReqId("a"))
    clock.now += 1.0
    held.hold(ReqId("a"))
    clock.now += 1.0
    assert held.released([ReqId("a")]) == (1, 2.0)
