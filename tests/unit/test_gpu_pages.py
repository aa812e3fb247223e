"""Page tables of the CUDA movers: which block goes to which pool row, and run merging."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from miniflex.errors import TransferError
from miniflex.gpu.pages import NO_BLOCK, merge_runs, page_table, slot_runs, vector_width
from miniflex.plan import ChunkMove
from miniflex.types import BlockId, SlotId


def chunk(slot: int, blocks: list[int], first: int = 0) -> ChunkMove:
    return ChunkMove(SlotId(slot), tuple(BlockId(b) for b in blocks), first)


def test_table_gives_each_block_its_layer0_row_and_marks_gaps_of_partial_chunks() -> None:
    # 4 blocks per chunk, 12 rows per slot (3 layers); a load of blocks 1-2 of slot 0.
    blocks, rows = page_table([chunk(2, [9, 5, 7, 1]), chunk(0, [30, 31], first=1)], 4, 12, 64)
    assert blocks.tolist() == [9, 5, 7, 1, NO_BLOCK, 30, 31, NO_BLOCK]
    assert rows.tolist() == [24, 25, 26, 27, 0, 1, 2, 3]
    assert blocks.dtype == rows.dtype == np.int64


def test_pairs_reject_chunks_past_their_end_and_unknown_blocks() -> None:
    with pytest.raises(TransferError, match=r"covers blocks 3\.\.5 of a 4-block chunk"):
        page_table([chunk(0, [1, 2], first=3)], 4, 4, 64)
    with pytest.raises(TransferError, match=r"block ids 1\.\.64 outside 0\.\.63"):
        page_table([chunk(0, [1, 64])], 4, 4, 64)
    with pytest.raises(TransferError, match=r"block ids -1\.\.-1 outside"):
        page_table([chunk(0, [-1], first=2)], 4, 4, 64)  # -1 is never taken for a gap


def test_empty_job_has_no_pages() -> None:
    blocks, rows = page_table([], 4, 4, 64)
    assert blocks.size == rows.size == 0
    assert [a.size for a in merge_runs(blocks, rows, True)] == [0, 0, 0]


def test_runs_merge_only_where_both_sides_are_consecutive() -> None:
    blocks = np.array([7, 8, 9, 3, 4, 20, 21], dtype=np.int64)
    rows = np.array([0, 1, 2, 3, 5, 6, 7], dtype=np.int64)  # row 4 skipped: 3 and 4 don't merge
    b0, r0, n = merge_runs(blocks, rows, mergeable=True)
    assert list(zip(b0.tolist(), r0.tolist(), n.tolist(), strict=True)) == [
        (7, 0, 3),
        (3, 3, 1),
        (4, 5, 1),
        (20, 6, 2),
    ]


def test_padded_caches_get_one_run_per_page() -> None:
    blocks = np.arange(5, dtype=np.int64)
    b0, r0, n = merge_runs(blocks, blocks + 10, mergeable=False)
    assert b0.tolist() == list(range(5)) and r0.tolist() == list(range(10, 15))
    assert n.tolist() == [1] * 5


def test_runs_cover_exactly_the_pages() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        blocks = rng.permutation(40)[:24]
        blocks[5:12] = np.arange(100, 107)  # one long contiguous stretch
        rows = np.arange(24) + 8 * rng.integers(0, 3)
        b0, r0, n = merge_runs(blocks, rows, mergeable=True)
        assert n.sum() == 24 and len(n) <= 24 - 6
        expanded_b = np.concatenate([np.arange(b, b + k) for b, k in zip(b0, n, strict=True)])
        expanded_r = np.concatenate([np.arange(r, r + k) for r, k in zip(r0, n, strict=True)])
        assert (expanded_b == blocks).all() and (expanded_r == rows).all()


def test_vector_width_is_the_widest_common_alignment() -> None:
    assert vector_width(None, page_bytes=65536, block_stride=65536, address=4096) == 16
    assert vector_width(0, page_bytes=65536, block_stride=65544, address=4096) == 8
    assert vector_width(None, page_bytes=6, address=4096) == 2
    assert vector_width(4, page_bytes=65536, block_stride=65544) == 4


def test_vector_width_explains_what_breaks_a_requested_width() -> None:
    with pytest.raises(TransferError, match=r"block_stride is 65544; this cache allows 8 at most"):
        vector_width(16, page_bytes=65536, block_stride=65544)
    with pytest.raises(TransferError, match="is not one of 16, 8, 4, 2, 1"):
        vector_width(32, page_bytes=65536)


def test_slot_runs_group_consecutive_slots_in_order() -> None:
    assert slot_runs([4, 5, 9, 2, 3]) == [(0, 2), (2, 1), (3, 2)]
    assert slot_runs([7]) == [(0, 1)]
    assert slot_runs([]) == []
    assert slot_runs([3, 2, 1]) == [(0, 1), (1, 1), (2, 1)]  # descending slots never merge


def test_slot_runs_are_maximal_and_cover_every_slot() -> None:
    rng = np.random.default_rng(1)
    for _ in range(50):
        slots = rng.permutation(30)[:12].tolist()
        slots[3:7] = [40, 41, 42, 43]
        runs = slot_runs(slots)
        assert sum(n for _, n in runs) == len(slots)
        for first, n in runs:
            assert slots[first : first + n] == list(range(slots[first], slots[first] + n))
        for (f1, n1), (f2, _) in itertools.pairwise(runs):
            assert f1 + n1 == f2 and slots[f2] != slots[f2 - 1] + 1  # nothing left to merge
