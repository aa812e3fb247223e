"""The staged mover: copy engines move whole chunk slots, a GPU kernel places the pages.

A chunk's slot in the pool is one contiguous range of host memory, while its
pages in vLLM's cache are scattered blocks of every layer. Moving each page
across PCIe on its own (the DMA mover: one 64 KiB copy per page) or by SM
loads and stores (the kernel mover) leaves 10-20% of the link's bandwidth
unused. This mover splits the two jobs:

* a **load** copies each slot whole with the copy engines into a *lane* of a
  staging buffer in GPU memory (one large ``cudaMemcpyAsync`` per run of
  consecutive slots), then the kernel of ``copy_pages.cu`` scatters the pages
  from the lane into vLLM's blocks, device to device;
* a **store** gathers the pages into a lane with the same kernel, then copies
  the lane to the slots.

Lanes are used round robin, so the copy of group ``k + 1`` runs while group
``k`` is scattered: the copy stream and the mover's stream wait for each other
only through per-lane events. Device-to-device page moves take microseconds,
so the SMs are busy a small fraction of the time the kernel mover needs.

A partial store (never made by the scheduler: stores move whole chunks)
falls back to the kernel mover's direct path, as do layerwise loads, which
copy one layer of every chunk at a time.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from miniflex.errors import TransferError
from miniflex.gpu.kernel_mover import KernelMover
from miniflex.gpu.pages import NO_BLOCK, merge_runs
from miniflex.layout import KVLayout
from miniflex.pool import HostPool

__all__ = ["LANE_BYTES", "LANES", "STAGED_CTAS", "StagedMover"]

STAGED_CTAS = 8
"""CTAs of the device-to-device gather/scatter (GPU memory is ~0.5 us away, not ~1.5)."""

LANE_BYTES = 32 << 20
"""Slots per lane: as many whole slots as fit in this (at least one); config
``staging_lane_bytes``. Every lane costs a handful of Python calls (a launch, events, the
copies), made on the transfer thread while vLLM's thread launches its kernels: with 8 MiB
lanes a 64-token chunk of an 8B model (9.4 MB) took a lane of its own."""

LANES = 4
"""Lanes of the staging buffer: copies of up to ``LANES - 1`` groups run ahead of the kernel."""

_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: direction from the (unified) addresses


class StagedMover(KernelMover):
    """Moves chunks as whole slots through a GPU staging buffer."""

    def __init__(
        self,
        layout: KVLayout,
        kv_caches: Mapping[str, torch.Tensor],
        pool: HostPool,
        ctas: int | None = None,
        vec: int | None = None,
        lanes: int = LANES,
        lane_bytes: int = LANE_BYTES,
    ) -> None:
        if ctas is not None and ctas < 1:
            raise TransferError(f"the staged mover needs at least one CTA, got {ctas}")
        # ``ctas`` (config kernel_ctas) sets the direct path's CTAs too; None: the kernel
        # mover's defaults (few for stores, more for a large layerwise load).
        super().__init__(layout, kv_caches, pool, ctas=ctas, vec=vec)
        self.staged_ctas = ctas or STAGED_CTAS
        if lanes < 2:
            raise TransferError(f"the staged mover needs at least 2 lanes, got {lanes}")
        self.slot_bytes = pool.slot_bytes
        self.slots_per_lane = max(1, lane_bytes // pool.slot_bytes)
        self.lanes = lanes
        lane = self.slots_per_lane * pool.slot_bytes
        self._staging = torch.empty(lanes * lane, dtype=torch.uint8, device=self.device)
        self._lane_ptrs = [self._staging.data_ptr() + i * lane for i in range(lanes)]
        self._host = pool.address
        self._copy_stream = torch.cuda.Stream(self.device)
        self._filled = [torch.cuda.Event() for _ in range(lanes)]
        self._drained = [torch.cuda.Event() for _ in range(lanes)]

    def _copy(self, blocks: np.ndarray, rows: np.ndarray, to_pool: bool, layers: range) -> None:
        g = self.layout.geometry
        bpc = g.blocks_per_chunk
        full = bool(np.all(blocks != NO_BLOCK))
        if len(layers) != g.num_layers or (to_pool and not full):
            super()._copy(blocks, rows, to_pool, layers)  # direct, page by page
            return
        slots = rows[::bpc] // self.rows_per_slot
        # Lane rows: chunk i of a group sits at slot position i of its lane.
        per = self.slots_per_lane
        in_lane = (np.arange(len(slots)) % per)[:, None] * self.rows_per_slot + np.arange(bpc)
        table = self._table(blocks, in_lane.reshape(-1))
        main = torch.cuda.current_stream(self.device)
        for k, start in enumerate(range(0, len(slots), per)):
            lane = k % self.lanes
            group = slots[start : start + per]
            entries = table[start * bpc : (start + len(group)) * bpc]
            if to_pool:
                self._gather_then_write(main, lane, group, entries, k)
            else:
                self._read_then_scatter(main, lane, group, entries, k)
        if to_pool:
            main.wait_stream(self._copy_stream)  # the caller's done event covers the writes

    def _read_then_scatter(
        self, main: torch.cuda.Stream, lane: int, group: np.ndarray, entries: torch.Tensor, k: int
    ) -> None:
        with torch.cuda.stream(self._copy_stream):
            if k >= self.lanes:  # the lane's previous group has been scattered
                self._copy_stream.wait_event(self._drained[lane])
            self._slots_dma(lane, group, to_pool=False)
            self._filled[lane].record(self._copy_stream)
        main.wait_event(self._filled[lane])
        self._lane_kernel(entries, lane, to_pool=False)
        self._drained[lane].record(main)

    def _gather_then_write(
        self, main: torch.cuda.Stream, lane: int, group: np.ndarray, entries: torch.Tensor, k: int
    ) -> None:
        if k >= self.lanes:  # the lane's previous group has reached the pool
            main.wait_event(self._drained[lane])
        self._lane_kernel(entries, lane, to_pool=True)
        self._filled[lane].record(main)
        with torch.cuda.stream(self._copy_stream):
            self._copy_stream.wait_event(self._filled[lane])
            self._slots_dma(lane, group, to_pool=True)
            self._drained[lane].record(self._copy_stream)

    def _lane_kernel(self, entries: torch.Tensor, lane: int, to_pool: bool) -> None:
        """Gather (``to_pool``) or scatter every layer of ``entries``' pages to or from ``lane``."""
        layers = range(self.layout.geometry.num_layers)
        ptr = self._lane_ptrs[lane]
        self._launch(entries.data_ptr(), len(entries), to_pool, layers, ptr, self.staged_ctas)

    def _slots_dma(self, lane: int, slots: np.ndarray, to_pool: bool) -> None:
        """Copy ``slots`` (in lane order) between the pool and ``lane``, one copy per run.

        Slots that follow each other in the pool (``s, s+1``) are one run. The
        last slot of a run moves only ``chunk_bytes``; a run's inner slots move
        whole, padding included (never read as KV).
        """
        import cupy

        chunk = self.layout.geometry.chunk_bytes
        stream = self._copy_stream.cuda_stream
        # Lane positions always follow on: runs are where the pool's slots do too.
        for slot, first, n in zip(*merge_runs(slots, np.arange(len(slots)), True), strict=True):
            host = self._host + int(slot) * self.slot_bytes
            dev = self._lane_ptrs[lane] + int(first) * self.slot_bytes
            size = (int(n) - 1) * self.slot_bytes + chunk
            src, dst = (dev, host) if to_pool else (host, dev)
            cupy.cuda.runtime.memcpyAsync(dst, src, size, _MEMCPY_DEFAULT, stream)
