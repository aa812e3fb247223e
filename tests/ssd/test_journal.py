"""SlotJournal: replay semantics, torn or garbage records, foreign headers, compaction."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from miniflex.ssd import SlotJournal
from miniflex.ssd.journal import RECORD_BYTES
from miniflex.types import ChunkKey, SlotId

DIGEST = bytes(range(16))
SLOT = 1 << 20
SLOTS = 64


def journal(path: Path, digest: bytes = DIGEST, slots: int = SLOTS) -> SlotJournal:
    return SlotJournal(str(path), digest, SLOT, slots)


def puts(*triples: tuple[int, int, int]) -> list[tuple[ChunkKey, SlotId, int]]:
    return [(ChunkKey(k), SlotId(s), c) for k, s, c in triples]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "j"


def test_replay_applies_puts_moves_and_deletes(path: Path) -> None:
    j = journal(path)
    j.put(puts((1, 0, 10), (2, 1, 20), (3, 2, 30), (2**128 - 1, 3, 2**32 - 1)))
    j.put(puts((1, 5, 11)))  # key 1 moves: slot 0 is free again
    j.put(puts((4, 1, 40)))  # a PUT into an occupied slot evicts key 2
    j.delete_keys([ChunkKey(3), ChunkKey(99)])
    j.delete_slots([SlotId(3)])
    expected = {1: (5, 11), 4: (1, 40)}
    assert dict(j.live) == expected
    assert not j.needs_delete(SlotId(0)) and j.needs_delete(SlotId(5))
    j.close()
    assert journal(path).replay() == expected
    assert os.stat(path).st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("damage", "damaged", "torn"),
    [
        ("truncated_mid_record", 0, RECORD_BYTES // 2),
        ("garbage_tail", 1, 10),
        ("zeroed_tail", 2, 4),
    ],
)
def test_torn_tail_keeps_every_complete_record(
    path: Path, damage: str, damaged: int, torn: int, caplog: pytest.LogCaptureFixture
) -> None:
    j = journal(path)
    for k in range(5):
        j.put(puts((k, k, k * 7)))
    j.close()
    size = os.path.getsize(path)
    if damage == "truncated_mid_record":  # the 5th PUT is torn
        os.truncate(path, size - RECORD_BYTES // 2)
        expected = {k: (k, k * 7) for k in range(4)}
    else:
        tail = os.urandom(RECORD_BYTES + 10) if damage == "garbage_tail" else bytes(100)
        with open(path, "ab") as f:
            f.write(tail)
        expected = {k: (k, k * 7) for k in range(5)}
    with caplog.at_level("WARNING", logger="miniflex.ssd"):
        reopened = journal(path)
    assert dict(reopened.live) == expected
    assert (reopened.damaged_records, reopened.torn_bytes) == (damaged, torn)
    assert f"skipped {damaged} damaged record(s) and {torn} byte(s) of a torn record" in caplog.text
    assert os.path.getsize(path) % RECORD_BYTES == 0  # compacted: the next append is aligned
    reopened.put(puts((9, 9, 9)))
    reopened.close()
    assert journal(path).replay() == {**expected, 9: (9, 9)}


def test_damaged_record_in_the_middle_is_skipped(path: Path) -> None:
    j = journal(path)
    for k in range(3):
        j.put(puts((k, k, k)))
    j.close()
    with open(path, "r+b") as f:
        f.seek(2 * RECORD_BYTES + 5)  # inside the record of key 1
        f.write(b"\xff")
    reopened = journal(path)
    assert dict(reopened.live) == {0: (0, 0), 2: (2, 2)}
    assert (reopened.damaged_records, reopened.torn_bytes) == (1, 0)


@pytest.mark.parametrize("other", [{"digest": bytes(16)}, {"slots": SLOTS + 1}])
def test_foreign_header_starts_empty_and_replaces_the_journal(
    path: Path, other: dict[str, object]
) -> None:
    j = journal(path)
    j.put(puts((1, 1, 1)))
    j.close()
    foreign = journal(path, **other)  # type: ignore[arg-type]
    assert foreign.reset_reason is not None and dict(foreign.live) == {}
    assert os.path.getsize(path) == RECORD_BYTES  # header only
    foreign.close()
    assert journal(path).reset_reason is not None  # the original layout is gone for good


def test_unreadable_header_starts_empty(path: Path) -> None:
    path.write_bytes(b"not a journal")
    j = journal(path)
    assert j.reset_reason == "the journal header is unreadable" and dict(j.live) == {}


def test_compaction_bounds_the_file_and_keeps_the_live_map(path: Path) -> None:
    j = journal(path)
    for round_ in range(60):  # 6000 PUTs onto 64 slots: far past 4x the live entries
        j.put(puts(*((round_ * 100 + i, i % SLOTS, round_) for i in range(100))))
    live = dict(j.live)
    assert len(live) == SLOTS
    assert os.path.getsize(path) <= RECORD_BYTES * (1 + 4 * 1024 + 100)
    j.close()
    assert journal(path).replay() == live
