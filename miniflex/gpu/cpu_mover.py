"""The torch mover: chunk copies with ``index_select``/``index_copy_`` on any device.

On vLLM's CPU backend the "GPU" KV cache lives in host memory, so a chunk load
is a gather from the pool into the paged cache. Each layer is viewed as raw
bytes ``[num_blocks, page_bytes]`` with vLLM's block stride, so every dtype
(fp8 included) and both page orders move the same way, bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from miniflex.errors import TransferError
from miniflex.gpu.base import KVMover
from miniflex.layout import KVLayout
from miniflex.plan import ChunkMove
from miniflex.pool import HostPool

__all__ = ["TorchMover", "byte_pages"]


def byte_pages(t: torch.Tensor, layout: KVLayout) -> torch.Tensor:
    """View one layer's ``[B, H, N, C]`` cache as ``[num_blocks, page_bytes]`` uint8."""
    u8 = t.view(torch.uint8)
    return torch.as_strided(
        u8,
        (layout.num_blocks, layout.geometry.page_bytes),
        (layout.block_stride, 1),
        storage_offset=u8.storage_offset(),
    )


class TorchMover(KVMover):
    """Moves chunks with torch indexing; used where the KV cache is in host memory."""

    def __init__(self, layout: KVLayout, kv_caches: Mapping[str, torch.Tensor], pool: HostPool):
        g = layout.geometry
        assert pool.slot_bytes >= g.chunk_bytes, "pool slots are smaller than a chunk"
        self.layout = layout
        self._layers = [byte_pages(t, layout) for t in kv_caches.values()]
        self._pool = torch.as_strided(
            torch.from_numpy(pool.array),
            (pool.num_slots, g.num_layers, g.blocks_per_chunk, g.page_bytes),
            (pool.slot_bytes, g.blocks_per_chunk * g.page_bytes, g.page_bytes, 1),
        )

    def _indices(self, chunks: Sequence[ChunkMove]) -> tuple[torch.Tensor, ...]:
        """Flatten chunks into parallel (slot, block-in-chunk, vLLM block) index tensors."""
        bpc = self.layout.geometry.blocks_per_chunk
        slots: list[int] = []
        offsets: list[int] = []
        blocks: list[int] = []
        for c in chunks:
            if c.first < 0 or c.first + len(c.block_ids) > bpc:
                raise TransferError(
                    f"chunk for slot {c.slot} covers blocks {c.first}..{c.first + len(c.block_ids)}"
                    f" of a {bpc}-block chunk"
                )
            slots += [c.slot] * len(c.block_ids)
            offsets += range(c.first, c.first + len(c.block_ids))
            blocks += c.block_ids
        if blocks and not 0 <= min(blocks) <= max(blocks) < self.layout.num_blocks:
            raise TransferError(
                f"block ids {min(blocks)}..{max(blocks)} outside 0..{self.layout.num_blocks - 1}"
            )
        as_t = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
        return as_t(slots), as_t(offsets), as_t(blocks)

    def store(self, chunks: Sequence[ChunkMove]) -> int:
        slots, offsets, blocks = self._indices(chunks)
        for layer, pages in enumerate(self._layers):
            self._pool[slots, layer, offsets] = pages.index_select(0, blocks)
        return len(blocks) * self.layout.geometry.num_layers * self.layout.geometry.page_bytes

    def load(self, chunks: Sequence[ChunkMove]) -> int:
        slots, offsets, blocks = self._indices(chunks)
        for layer, pages in enumerate(self._layers):
            pages.index_copy_(0, blocks, self._pool[slots, layer, offsets])
        return len(blocks) * self.layout.geometry.num_layers * self.layout.geometry.page_bytes
