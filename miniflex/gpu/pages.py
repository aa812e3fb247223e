"""Which pages move where: the page tables the CUDA movers hand to the GPU (pure Python).

A chunk copy is a list of *pages*: one vLLM block of one layer and one row of
the pool, where the pool is viewed as ``[num_slots * rows_per_slot]`` rows of
``page_bytes`` (see :mod:`miniflex.layout`). Page ``j`` of layer ``l`` of the
chunk in slot ``s`` is pool row ``s * rows_per_slot + l * blocks_per_chunk + j``,
so a table of ``(vLLM block, pool row of layer 0)`` pairs describes every layer:
layer ``l`` adds ``l * blocks_per_chunk`` to each row.

The table has ``blocks_per_chunk`` entries per chunk, so entry ``k * bpc + j``
is block ``j`` of the ``k``-th chunk; blocks a partial chunk does not move are
:data:`NO_BLOCK`. That lets the kernel walk each chunk's slot front to back
(layer by layer), which keeps its host accesses sequential.

Example: 2-block chunks, 8 rows per slot; slot 3 moving only its block 1, into
vLLM block 40 (``first=1``, a load that starts inside the chunk)::

    page_table([ChunkMove(SlotId(3), (BlockId(40),), first=1)], 2, 8, 64)
    # -> blocks [-1, 40], rows [24, 25]        (3 * 8 + 0, 3 * 8 + 1)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from miniflex.errors import TransferError
from miniflex.plan import ChunkMove

__all__ = ["NO_BLOCK", "VECTOR_WIDTHS", "merge_runs", "page_table", "slot_runs", "vector_width"]

NO_BLOCK = -1
"""Table entry of a chunk position that this call does not move (GPU-side sentinel)."""

VECTOR_WIDTHS = (16, 8, 4, 2, 1)
"""Bytes one GPU thread moves per access, widest first (16: ``uint4``)."""


def page_table(
    chunks: Sequence[ChunkMove], blocks_per_chunk: int, rows_per_slot: int, num_blocks: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(blocks, rows)``: int64 arrays of ``len(chunks) * blocks_per_chunk`` entries.

    ``rows[k * bpc + j]`` is the layer-0 pool row of block ``j`` of chunk ``k``
    and ``blocks[...]`` the vLLM block it moves to or from, or
    :data:`NO_BLOCK`. Raises TransferError for a chunk that runs past its end
    or a block id outside vLLM's cache, before anything is copied.
    """
    bpc = blocks_per_chunk
    blocks = np.full(len(chunks) * bpc, NO_BLOCK, dtype=np.int64)
    given = np.zeros(len(chunks) * bpc, dtype=bool)
    slots = np.empty(len(chunks), dtype=np.int64)
    for k, c in enumerate(chunks):
        end = c.first + len(c.block_ids)
        if c.first < 0 or end > bpc:
            raise TransferError(
                f"chunk for slot {c.slot} covers blocks {c.first}..{end} of a {bpc}-block chunk"
            )
        blocks[k * bpc + c.first : k * bpc + end] = c.block_ids
        given[k * bpc + c.first : k * bpc + end] = True
        slots[k] = c.slot
    moved = blocks[given]
    if moved.size and (int(moved.min()) < 0 or int(moved.max()) >= num_blocks):
        raise TransferError(
            f"block ids {int(moved.min())}..{int(moved.max())} outside 0..{num_blocks - 1}"
        )
    rows = (slots[:, None] * rows_per_slot + np.arange(bpc, dtype=np.int64)).reshape(-1)
    return blocks, rows


def merge_runs(
    blocks: np.ndarray, rows: np.ndarray, mergeable: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group pages into runs that are contiguous on both sides: ``(block0, row0, length)``.

    Consecutive pages merge when their vLLM blocks and their pool rows both
    follow on (``b, b+1`` and ``r, r+1``). That is only one contiguous range
    of device memory when blocks are ``page_bytes`` apart, so callers pass
    ``mergeable=False`` for a padded cache and get one run per page. Runs of
    layer 0 are runs of every layer, since each layer shifts all rows alike.

    Example: blocks ``[7, 8, 9, 3]``, rows ``[0, 1, 2, 3]`` -> runs
    ``(7, 0, 3)`` and ``(3, 3, 1)``.
    """
    n = len(blocks)
    if n == 0 or not mergeable:
        return blocks, rows, np.ones(n, dtype=np.int64)
    follows = (np.diff(blocks) == 1) & (np.diff(rows) == 1)
    starts = np.flatnonzero(np.concatenate(([True], ~follows)))
    lengths = np.diff(np.append(starts, n))
    return blocks[starts], rows[starts], lengths


def slot_runs(slots: Sequence[int]) -> list[tuple[int, int]]:
    """``(first position, length)`` of each run of consecutive slots (``s, s+1, ...``) in
    ``slots``, in order: ``[4, 5, 9, 2, 3]`` -> ``[(0, 2), (2, 1), (3, 2)]``.

    :func:`merge_runs` for the few slots of one staging lane, in plain Python: the
    staged mover calls it per lane while holding the interpreter lock, where numpy's
    per-call cost on three elements is most of the work."""
    runs: list[tuple[int, int]] = []
    first = 0
    for i in range(1, len(slots) + 1):
        if i == len(slots) or slots[i] != slots[i - 1] + 1:
            runs.append((first, i - first))
            first = i
    return runs


def vector_width(requested: int | None, **byte_quantities: int) -> int:
    """The access width for pages whose every address and size is a multiple of it.

    ``requested`` None (or 0) picks the widest of :data:`VECTOR_WIDTHS` that
    divides every quantity; a requested width that does not divide them all
    raises TransferError naming the quantity that breaks it.
    """
    if requested:
        if requested not in VECTOR_WIDTHS:
            raise TransferError(
                f"vector width {requested} is not one of {', '.join(map(str, VECTOR_WIDTHS))}"
            )
        for name, value in byte_quantities.items():
            if value % requested:
                best = vector_width(None, **byte_quantities)
                raise TransferError(
                    f"vector width {requested} needs every address and size to be a multiple of "
                    f"{requested} bytes, but {name} is {value}; this cache allows {best} at "
                    "most (0 chooses automatically)"
                )
        return requested
    return next(w for w in VECTOR_WIDTHS if all(v % w == 0 for v in byte_quantities.values()))
