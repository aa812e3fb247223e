"""The staged mover's staging buffer against the GPU memory vLLM leaves (``gpu/headroom.py``)."""

from __future__ import annotations

from miniflex.gpu.headroom import MARGIN, staging_bytes, staging_problem

MIB = 1 << 20


def test_lanes_hold_whole_slots_and_at_least_one() -> None:
    assert staging_bytes(slot_bytes=MIB, lane_bytes=32 * MIB, lanes=4) == 128 * MIB
    nine = 9_437_184  # a 64-token chunk of an 8B model: 3 whole slots in a 32 MiB lane
    assert staging_bytes(nine, 32 * MIB, 4) == 4 * 3 * nine
    assert staging_bytes(64 * MIB, 32 * MIB, 4) == 4 * 64 * MIB  # a slot larger than a lane


def test_a_buffer_fits_only_with_the_margin_to_spare_and_the_refusal_says_how_to_fix_it() -> None:
    needed = 128 * MIB
    assert staging_problem(needed, needed + MARGIN) is None
    problem = staging_problem(needed, needed + MARGIN - 1)
    assert problem is not None
    for words in ("128 MiB", "--gpu-memory-utilization", "staging_lane_bytes", "mover=kernel"):
        assert words in problem, words
