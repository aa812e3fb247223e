"""A load's fetched chunks handed to its GPU copy in groups as they arrive, without a store."""

from __future__ import annotations

from miniflex.plan import ChunkMove, RemoteCopy
from miniflex.types import BlockId, ChunkKey, SlotId
from miniflex.worker.fetch_handoff import HANDOFF_PARTS, Handoff

MOVES = tuple(ChunkMove(SlotId(s), (BlockId(2 * s), BlockId(2 * s + 1))) for s in range(6))
FETCHES = tuple(RemoteCopy(ChunkKey(100 + s), SlotId(s)) for s in (2, 3, 4, 5))  # 0, 1: CPU


def handoff(group: int | None = 2) -> tuple[Handoff, list[tuple[tuple[int, ...], tuple[int, ...]]]]:
    sent: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    h = Handoff(
        MOVES, FETCHES, lambda moves, lost: sent.append((tuple(m.slot for m in moves), lost)), group
    )
    return h, sent


def test_every_group_of_arrived_chunks_goes_as_one_copy_with_the_failed_ones_blocks() -> None:
    h, sent = handoff()
    h.arrived(FETCHES[1], True)
    assert sent == []  # one arrived: the group is not full
    h.arrived(FETCHES[0], False)  # failed: its blocks go with the next copy
    h.arrived(FETCHES[3], True)
    assert sent == [((3, 5), (4, 5))]
    h.flush({FETCHES[0].key})  # slot 4 was not told of, and its key did not fail
    assert sent == [((3, 5), (4, 5)), ((4,), ())]
    h.arrived(FETCHES[2], False)  # after the flush: ignored
    assert sent == [((3, 5), (4, 5)), ((4,), ())]


def test_a_flush_with_nothing_left_sends_no_empty_copy() -> None:
    h, sent = handoff(group=4)
    for c in FETCHES:
        h.arrived(c, True)
    h.flush(set())
    assert sent == [((2, 3, 4, 5), ())]


def test_flush_settles_the_chunks_no_one_told_of_by_the_failed_keys() -> None:
    """A rank that awaited another's fetches is told of none: the failed keys decide."""
    h, sent = handoff()
    h.arrived(FETCHES[0], True)
    h.flush({FETCHES[2].key})
    assert len(sent) == 1
    slots, lost = sent[0]
    assert sorted(slots) == [2, 3, 5] and lost == (8, 9)


def test_close_returns_what_was_never_sent_and_stops_later_hand_offs() -> None:
    h, sent = handoff()
    h.arrived(FETCHES[0], True)
    h.arrived(FETCHES[1], True)  # sent
    h.arrived(FETCHES[2], True)  # arrived, not sent yet
    unsent = h.close()
    assert [m.slot for m in unsent] == [4, 5]
    h.arrived(FETCHES[3], True)
    assert sent == [((2, 3), ())]


def test_by_default_a_load_goes_in_about_eight_copies() -> None:
    moves = tuple(ChunkMove(SlotId(s), (BlockId(s),)) for s in range(20))
    fetches = tuple(RemoteCopy(ChunkKey(s), SlotId(s)) for s in range(20))
    sent: list[int] = []
    h = Handoff(moves, fetches, lambda moves, lost: sent.append(len(moves)))
    for c in fetches:
        h.arrived(c, True)
    h.flush(set())
    assert sent == [3] * 6 + [2] and len(sent) <= HANDOFF_PARTS
