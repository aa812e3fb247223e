"""The staged mover: copy engines move whole chunk slots, a GPU kernel places the pages.

A chunk's slot in the pool is one contiguous range of host memory, while its
pages in vLLM's cache are scattered blocks of every layer. Moving each page
across PCIe on its own (the DMA mover: one 64 KiB copy per page) or by SM
loads and stores (the kernel mover) leaves part of the link's bandwidth
unused. This mover splits the two jobs:

* a **load** copies each slot whole with the copy engines into a *lane* of a
  staging buffer in GPU memory (one large ``cudaMemcpyAsync`` per run of
  consecutive slots), then the kernel of ``copy_pages.cu`` scatters the pages
  from the lane into vLLM's blocks, device to device;
* a **store** (with ``direct_stores`` off) gathers the pages into a lane with
  the same kernel, then copies the lane to the slots.

Lanes are used round robin, so the copy of group ``k + 1`` runs while group
``k`` is scattered: the copy stream and the mover's stream wait for each other
only through per-lane events. Device-to-device page moves take microseconds,
so the SMs are busy a small fraction of the time the kernel mover needs.

A lane call is issued through driver calls that keep the interpreter lock
(:mod:`~miniflex.gpu.held_driver`): this runs on a worker thread beside vLLM's,
and a binding that releases the lock for each of a call's dozens of CUDA calls
lets vLLM's thread in and out each time. Only the waits release it.

A copy vLLM queues on another stream during a store's lane copies (its sampled
tokens, to the host after each step) waited for nearly the whole store in
``bench.copy_queue``, however few lanes were queued at once: the copy engine
seems to keep serving a stream until it runs dry. So by default
(``direct_stores``) a store skips the lanes and takes the kernel mover's
direct path: its SMs write the pages into the pool through its mapped address
and no copy engine is used (a little below the lanes' bytes per second:
docs/benchmarks.md, "Components", "GPU <-> CPU pool, per mover"; its CUDA
calls go through torch and CuPy, which let go of the lock). A load's lanes do
not hold up vLLM's copies to the GPU: the copy stream waits for each lane's
scatter, and vLLM's copies get in meanwhile.

With ``direct_stores`` off, a partial store (never made by the scheduler:
stores move whole chunks) still falls back to the direct path, as do layerwise
loads, which copy one layer of every chunk at a time.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from miniflex.errors import TransferError
from miniflex.gpu import held_driver as held
from miniflex.gpu.kernel_mover import THREADS, KernelMover
from miniflex.gpu.pages import NO_BLOCK, slot_runs
from miniflex.layout import KVLayout
from miniflex.plan import ChunkMove
from miniflex.pool import HostPool

__all__ = ["LANE_BYTES", "LANES", "STAGED_CTAS", "StagedMover", "raw_events"]

STAGED_CTAS = 8
"""CTAs of the device-to-device gather/scatter (GPU memory is ~0.5 us away, not ~1.5)."""

LANE_BYTES = 32 << 20
"""Slots per lane: as many whole slots as fit in this (at least one); config
``staging_lane_bytes``. Every lane costs a handful of CUDA calls (a launch, events, the
copies) on the transfer thread: with 8 MiB lanes a 64-token chunk of an 8B model (9.4 MB)
took a lane of its own."""

LANES = 4
"""Lanes of the staging buffer: copies of up to ``LANES - 1`` groups run ahead of the kernel."""

_U64, _I64, _I32 = ctypes.c_uint64, ctypes.c_int64, ctypes.c_int32
_KERNEL_ARGS = (_U64, _U64, _U64, _I64, _I32, _I32, _I32, _I64, _I64, _I32)
"""``miniflex_copy_pages``'s parameters, in order (``copy_pages.cu``)."""


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
        direct_stores: bool = True,
    ) -> None:
        """``direct_stores``: stores take the kernel mover's direct path (no copy engine);
        False: they go through the lanes like loads."""
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
        self.direct_stores = direct_stores
        self._staging = torch.empty(lanes * lane, dtype=torch.uint8, device=self.device)
        self._lane_ptrs = [self._staging.data_ptr() + i * lane for i in range(lanes)]
        self._host = pool.address
        self._copy_stream = torch.cuda.Stream(self.device)
        # Raw CUDA events, kept for the process's life like the streams.
        with torch.cuda.device(self.device_index):
            events = raw_events(2 * lanes)
            (self._done,) = raw_events(1, blocking=True)  # a waiting thread sleeps
        self._filled = events[:lanes]  # the lane holds its group's pages
        self._drained = events[lanes:]  # the lane is free again
        with cupy_device(self.device_index):  # the CUfunction of this device's module
            self._lane_kernel = held.HeldLaunch(self._kernel.kernel.ptr, _KERNEL_ARGS)

    def _move(self, chunks: Sequence[ChunkMove], after: object, to_pool: bool) -> int:
        if to_pool and self.direct_stores:
            return super()._move(chunks, after, to_pool)  # direct: no copy engine
        blocks, rows = self._pages(chunks, after)
        if to_pool and not bool(np.all(blocks != NO_BLOCK)):
            return super()._move(chunks, after, to_pool)  # direct, page by page
        nbytes = self._moved_bytes(blocks)
        if nbytes == 0:
            return 0
        try:
            with torch.cuda.device(self.device_index):
                held.bind(self.device_index)
                self._issue(blocks, rows, after, to_pool)
                _runtime().eventSynchronize(self._done)  # the one call that lets go of the GIL
        except (RuntimeError, TransferError) as exc:  # CUDA errors from CuPy or the driver
            raise TransferError(f"{type(self).__name__} copy failed: {exc}") from exc
        return nbytes

    def _issue(self, blocks: np.ndarray, rows: np.ndarray, after: object, to_pool: bool) -> None:
        """Queue a call's copies, group by group, and record ``_done`` after the last."""
        bpc = self.layout.geometry.blocks_per_chunk
        slots = (rows[::bpc] // self.rows_per_slot).tolist()
        # Lane rows: chunk i of a group sits at slot position i of its lane.
        per = self.slots_per_lane
        in_lane = (np.arange(len(slots)) % per)[:, None] * self.rows_per_slot + np.arange(bpc)
        main, copy = self.stream.cuda_stream, self._copy_stream.cuda_stream
        if after is not None:  # a torch event recorded by fence()
            held.wait_event(main, after.cuda_event)  # type: ignore[attr-defined]
        table = self._upload_table(blocks, in_lane.reshape(-1), main)
        for k, start in enumerate(range(0, len(slots), per)):
            lane = k % self.lanes
            group = slots[start : start + per]
            entries = (table + start * bpc * 16, len(group) * bpc)  # 16: one (block, row) pair
            if to_pool:
                self._gather_then_write(main, copy, lane, group, entries, k)
            else:
                self._read_then_scatter(main, copy, lane, group, entries, k)
        # A store's last copy follows every gather; a load's last scatter every copy.
        held.record(self._done, copy if to_pool else main)

    def _upload_table(self, blocks: np.ndarray, rows: np.ndarray, stream: int) -> int:
        """Queue the upload of the ``(block, row)`` pairs on ``stream``; their device address.
        The buffers are reused: each call has completed before the next starts."""
        host, dev = self._filled_table(blocks, rows)
        held.copy_async(dev.data_ptr(), host.data_ptr(), len(blocks) * 16, stream)
        return int(dev.data_ptr())

    def _read_then_scatter(
        self, main: int, copy: int, lane: int, group: list[int], entries: tuple[int, int], k: int
    ) -> None:
        if k >= self.lanes:  # the lane's previous group has been scattered
            held.wait_event(copy, self._drained[lane])
        self._slots_dma(copy, lane, group, to_pool=False)
        held.record(self._filled[lane], copy)
        held.wait_event(main, self._filled[lane])
        self._launch_lane(main, entries, lane, to_pool=False)
        held.record(self._drained[lane], main)

    def _gather_then_write(
        self, main: int, copy: int, lane: int, group: list[int], entries: tuple[int, int], k: int
    ) -> None:
        if k >= self.lanes:  # the lane's previous group has reached the pool
            held.wait_event(main, self._drained[lane])
        self._launch_lane(main, entries, lane, to_pool=True)
        held.record(self._filled[lane], main)
        held.wait_event(copy, self._filled[lane])
        self._slots_dma(copy, lane, group, to_pool=True)
        held.record(self._drained[lane], copy)

    def _launch_lane(self, stream: int, entries: tuple[int, int], lane: int, to_pool: bool) -> None:
        """Gather (``to_pool``) or scatter every layer of ``entries = (table address, rows)``
        to or from ``lane``, on ``stream``."""
        g, layout = self.layout.geometry, self.layout
        table, n = entries
        items = n * g.num_layers
        self._lane_kernel(
            max(1, min(self.staged_ctas, items)),
            THREADS,
            stream,
            self._layers.data_ptr(),
            table,
            self._lane_ptrs[lane],
            n // g.blocks_per_chunk,
            g.blocks_per_chunk,
            0,
            g.num_layers,
            layout.block_stride,
            g.page_bytes,
            1 if to_pool else 0,
        )

    def _slots_dma(self, stream: int, lane: int, slots: list[int], to_pool: bool) -> None:
        """Copy ``slots`` (in lane order) between the pool and ``lane``, one copy per run.

        Slots that follow each other in the pool (``s, s+1``) are one run. The
        last slot of a run moves only ``chunk_bytes``; a run's inner slots move
        whole, padding included (never read as KV).
        """
        chunk, size = self.layout.geometry.chunk_bytes, self.slot_bytes
        lane_ptr = self._lane_ptrs[lane]
        # Lane positions always follow on: runs are where the pool's slots do too.
        for first, n in slot_runs(slots):
            host = self._host + slots[first] * size
            dev = lane_ptr + first * size
            src, dst = (dev, host) if to_pool else (host, dev)
            held.copy_async(dst, src, (n - 1) * size + chunk, stream)


def cupy_device(index: int) -> Any:
    """CuPy's context manager for device ``index``."""
    import cupy

    return cupy.cuda.Device(index)


def _runtime() -> Any:
    """CuPy's CUDA runtime bindings (imported when a mover runs, never at module import)."""
    import cupy

    return cupy.cuda.runtime


def raw_events(count: int, blocking: bool = False) -> list[int]:
    """``count`` CUDA events on the current device, timing off (they only order work);
    ``blocking``: a thread that waits for one sleeps instead of spinning."""
    rt = _runtime()
    flags = rt.eventDisableTiming | (rt.eventBlockingSync if blocking else 0)
    return [rt.eventCreateWithFlags(flags) for _ in range(count)]
