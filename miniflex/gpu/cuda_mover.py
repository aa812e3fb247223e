"""What the kernel and DMA movers share: checks, the pinned pool, a stream, ordering.

Each CUDA mover owns one stream. A copy waits there for the caller's fence
(an event recorded on vLLM's stream when the job was queued), runs, records
an event, and the call returns once that event has completed, so the
destination may be read at once (the KVMover contract). Only the transfer
thread waits; vLLM's stream never does. A mover is used by one thread at a
time; separate movers may run concurrently on separate threads.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from miniflex.errors import TransferError
from miniflex.gpu import pinning
from miniflex.gpu.base import KVMover
from miniflex.gpu.pages import NO_BLOCK, page_table
from miniflex.layout import KVLayout
from miniflex.plan import ChunkMove
from miniflex.pool import HostPool

__all__ = ["CudaMover", "check_cuda_caches"]


def check_cuda_caches(layout: KVLayout, kv_caches: Mapping[str, torch.Tensor]) -> torch.device:
    """The CUDA device holding every layer; TransferError if the tensors don't fit ``layout``."""
    if not kv_caches:
        raise TransferError("no KV cache tensors were registered")
    g = layout.geometry
    devices = {t.device for t in kv_caches.values()}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        names = ", ".join(sorted(str(d) for d in devices))
        raise TransferError(f"the CUDA movers need every KV layer on one CUDA device, got {names}")
    for name, t in kv_caches.items():
        if t.element_size() != g.itemsize or str(t.dtype).removeprefix("torch.") != g.dtype:
            raise TransferError(f"layer {name} is {t.dtype}, but the layout says {g.dtype}")
        if t.shape[0] != layout.num_blocks or t.stride(0) * t.element_size() != layout.block_stride:
            raise TransferError(
                f"layer {name} has {t.shape[0]} blocks {t.stride(0) * t.element_size()} bytes "
                f"apart; the layout says {layout.num_blocks} blocks {layout.block_stride} apart"
            )
    if len(kv_caches) != g.num_layers:
        raise TransferError(f"{len(kv_caches)} KV layers registered, layout has {g.num_layers}")
    return next(iter(devices))


class CudaMover(KVMover):
    """Base of the CUDA movers: subclasses implement :meth:`_copy` for one batch of pages."""

    def __init__(
        self, layout: KVLayout, kv_caches: Mapping[str, torch.Tensor], pool: HostPool
    ) -> None:
        g = layout.geometry
        assert pool.slot_bytes >= g.chunk_bytes, "pool slots are smaller than a chunk"
        assert pool.slot_bytes % g.page_bytes == 0, "slots must hold whole pages"
        self.layout = layout
        self.device = check_cuda_caches(layout, kv_caches)
        self.device_index = self.device.index if self.device.index is not None else 0
        with torch.cuda.device(self.device_index):
            if not pinning.pin(pool.address, pool.nbytes, mapped=True):
                raise TransferError(
                    f"could not page-lock and map the {pool.nbytes}-byte CPU pool for CUDA; "
                    "the 'cpu' mover works with pageable memory"
                )
            self.pool_ptr = pinning.device_pointer(pool.address)
        self.layer_ptrs = [int(t.data_ptr()) for t in kv_caches.values()]
        self.rows_per_slot = pool.slot_bytes // g.page_bytes
        self.stream = torch.cuda.Stream(self.device)

    def fence(self) -> object:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def store(self, chunks: Sequence[ChunkMove], after: object = None) -> int:
        return self._move(chunks, after, to_pool=True)

    def load(self, chunks: Sequence[ChunkMove], after: object = None) -> int:
        return self._move(chunks, after, to_pool=False)

    def _move(self, chunks: Sequence[ChunkMove], after: object, to_pool: bool) -> int:
        g = self.layout.geometry
        blocks, rows = page_table(
            chunks, g.blocks_per_chunk, self.rows_per_slot, self.layout.num_blocks
        )
        pages = int(np.count_nonzero(blocks != NO_BLOCK))
        if pages == 0:
            return 0
        if after is not None and not isinstance(after, torch.cuda.Event):
            raise TransferError(f"'after' must be a marker from fence(), got {type(after)}")
        done = torch.cuda.Event()
        try:
            with torch.cuda.device(self.device_index), torch.cuda.stream(self.stream):
                if after is not None:
                    self.stream.wait_event(after)
                self._copy(blocks, rows, to_pool)
                done.record(self.stream)
            done.synchronize()
        except RuntimeError as exc:  # CUDA errors from torch, CuPy or the driver
            raise TransferError(f"{type(self).__name__} copy failed: {exc}") from exc
        return pages * g.num_layers * g.page_bytes

    @abstractmethod
    def _copy(self, blocks: np.ndarray, rows: np.ndarray, to_pool: bool) -> None:
        """Enqueue the copy of every layer's pages on ``self.stream`` (the current stream).

        ``(blocks, rows)`` is the validated :func:`~miniflex.gpu.pages.page_table`
        of the call: ``blocks_per_chunk`` entries per chunk, ``NO_BLOCK`` where a
        partial chunk moves nothing. Must not wait for the copy.
        """
