"""The torch mover: chunk copies with ``index_select``/``index_copy_`` on any device.

On vLLM's CPU backend the "GPU" KV cache lives in host memory, so a chunk load
is a gather from the pool into the paged cache. Each layer is viewed as raw
words ``[num_blocks, page_words]`` with vLLM's block stride, so every dtype
(fp8 included) and both page orders move the same way, bit for bit.

On CUDA the same code runs on the mover's own stream, after an event recorded
on vLLM's stream when the job was queued, through a device staging buffer, and
returns only when the copy is done. That is correct but not fast; the CuPy
kernel and DMA movers are the CUDA path.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence

import torch

from miniflex.errors import TransferError
from miniflex.gpu.base import KVMover
from miniflex.layout import KVLayout
from miniflex.plan import ChunkMove
from miniflex.pool import HostPool

__all__ = ["TorchMover", "byte_pages"]


STAGING_BYTES = 16 << 20
"""Reused buffer between gather and scatter (one per mover, used under the mover's lock)."""

_WORDS = ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.uint8))


def word_dtype(*byte_counts: int) -> tuple[int, torch.dtype]:
    """The widest integer word dividing every count: torch's gathers move whole elements,
    and moving 8-byte words instead of bytes moves an eighth as many elements, which
    makes them much faster."""
    return next((w, d) for w, d in _WORDS if all(n % w == 0 for n in byte_counts))


def byte_pages(t: torch.Tensor, layout: KVLayout, word: int, dtype: torch.dtype) -> torch.Tensor:
    """View one layer's ``[B, H, N, C]`` cache as ``[num_blocks, page_bytes / word]`` words."""
    u8 = t.view(torch.uint8)
    assert u8.storage_offset() % word == 0
    return torch.as_strided(
        u8,
        (layout.num_blocks, layout.geometry.page_bytes),
        (layout.block_stride, 1),
        storage_offset=u8.storage_offset(),
    ).view(dtype)


class TorchMover(KVMover):
    """Moves chunks with torch indexing; used where the KV cache is in host memory.

    Its staging buffers are shared by every call, and ``load_layerwise`` (the
    base class's: a whole ``load``) runs on vLLM's thread beside the transfer
    thread's calls, so calls take turns on a lock.
    """

    def __init__(self, layout: KVLayout, kv_caches: Mapping[str, torch.Tensor], pool: HostPool):
        g = layout.geometry
        assert pool.slot_bytes >= g.chunk_bytes, "pool slots are smaller than a chunk"
        self.layout = layout
        offsets = [t.view(torch.uint8).storage_offset() for t in kv_caches.values()]
        word, dtype = word_dtype(g.page_bytes, layout.block_stride, pool.slot_bytes, *offsets)
        self._layers = [byte_pages(t, layout, word, dtype) for t in kv_caches.values()]
        assert pool.slot_bytes % g.page_bytes == 0, "slots must hold whole pages"
        self._rows_per_slot = pool.slot_bytes // g.page_bytes
        # The pool as rows of pages: page j of layer l of slot s is row s*rows + l*bpc + j.
        self._pool_rows = torch.from_numpy(pool.array).view(dtype).view(-1, g.page_bytes // word)
        staging_rows = max(1, STAGING_BYTES // g.page_bytes)
        device = self._layers[0].device
        self._device = device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._host_stage = torch.empty(
            staging_rows, g.page_bytes // word, dtype=dtype, pin_memory=device.type == "cuda"
        )
        self._lock = threading.Lock()
        self._dev_stage = (
            self._host_stage
            if device.type == "cpu"
            else torch.empty(staging_rows, g.page_bytes // word, dtype=dtype, device=device)
        )

    def _indices(self, chunks: Sequence[ChunkMove]) -> tuple[torch.Tensor, torch.Tensor]:
        """Flatten chunks into parallel (pool row of layer 0, vLLM block) index tensors."""
        bpc = self.layout.geometry.blocks_per_chunk
        rows: list[int] = []
        blocks: list[int] = []
        for c in chunks:
            if c.first < 0 or c.first + len(c.block_ids) > bpc:
                raise TransferError(
                    f"chunk for slot {c.slot} covers blocks {c.first}..{c.first + len(c.block_ids)}"
                    f" of a {bpc}-block chunk"
                )
            base = c.slot * self._rows_per_slot
            rows += range(base + c.first, base + c.first + len(c.block_ids))
            blocks += c.block_ids
        if blocks and not 0 <= min(blocks) <= max(blocks) < self.layout.num_blocks:
            raise TransferError(
                f"block ids {min(blocks)}..{max(blocks)} outside 0..{self.layout.num_blocks - 1}"
            )
        return torch.tensor(rows, dtype=torch.long), torch.tensor(blocks, dtype=torch.long)

    # index_select into a fresh tensor costs page faults on every call;
    # into a reused staging buffer it runs near memcpy speed.
    def _staged(self, n: int) -> list[tuple[slice, torch.Tensor, torch.Tensor]]:
        """Batches of at most one staging buffer of rows: (part, host view, device view)."""
        step = self._host_stage.shape[0]
        out = []
        for i in range(0, n, step):
            k = min(step, n - i)
            out.append((slice(i, i + k), self._host_stage[:k], self._dev_stage[:k]))
        return out

    def fence(self) -> object:
        if self._stream is None:
            return None
        event = torch.cuda.Event(blocking=True)  # waited for by wait_for: sleep, not spin
        event.record(torch.cuda.current_stream(self._device))
        return event

    @contextlib.contextmanager
    def _ordered(self, after: object) -> Iterator[None]:
        """On CUDA: run on the mover's stream after ``after``; return only when done."""
        if self._stream is None:
            yield
            return
        with torch.cuda.stream(self._stream):
            if after is not None:
                self._stream.wait_event(after)  # type: ignore[arg-type]
            yield
        self._stream.synchronize()

    def store(self, chunks: Sequence[ChunkMove], after: object = None) -> int:
        return self._move(chunks, after, to_pool=True)

    def load(self, chunks: Sequence[ChunkMove], after: object = None) -> int:
        return self._move(chunks, after, to_pool=False)

    def _move(self, chunks: Sequence[ChunkMove], after: object, to_pool: bool) -> int:
        with self._lock:
            return self._move_locked(chunks, after, to_pool)

    def _move_locked(self, chunks: Sequence[ChunkMove], after: object, to_pool: bool) -> int:
        rows, blocks = self._indices(chunks)
        bpc = self.layout.geometry.blocks_per_chunk
        with self._ordered(after):
            blocks = blocks.to(self._device)
            for layer, pages in enumerate(self._layers):
                for part, host, dev in self._staged(len(rows)):
                    pool_rows = rows[part] + layer * bpc
                    if to_pool:  # gather pages -> staging -> scatter into slots
                        torch.index_select(pages, 0, blocks[part], out=dev)
                        if dev is not host:
                            host.copy_(dev)
                        self._pool_rows.index_copy_(0, pool_rows, host)
                    else:  # gather from slots -> staging -> scatter into pages
                        torch.index_select(self._pool_rows, 0, pool_rows, out=host)
                        if dev is not host:
                            dev.copy_(host)
                        pages.index_copy_(0, blocks[part], dev)
        return len(rows) * self.layout.geometry.num_layers * self.layout.geometry.page_bytes
