"""The DMA mover: the copy engines move the pages, no SM is used.

Every page (or run of pages contiguous on both sides, see
:func:`~miniflex.gpu.pages.merge_runs`) becomes one entry of
``cuMemcpyBatchAsync`` (CUDA 12.8+ drivers) through ``cuda.bindings``, issued
in batches of ``BATCH`` so that building the next batch's pointer lists
overlaps the copies of the previous one. Older drivers get one
``cuMemcpyAsync`` per entry, which is correct but bound by call overhead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from miniflex.gpu import cuda_driver
from miniflex.gpu.cuda_mover import CudaMover
from miniflex.gpu.pages import NO_BLOCK, merge_runs
from miniflex.layout import KVLayout
from miniflex.pool import HostPool

__all__ = ["BATCH", "DMAMover"]

BATCH = 512
"""Copies per ``cuMemcpyBatchAsync`` call."""

_BATCH_API_VERSION = 12080


class DMAMover(CudaMover):
    """Moves chunks with batched asynchronous memcpy on the mover's stream."""

    def __init__(
        self,
        layout: KVLayout,
        kv_caches: Mapping[str, torch.Tensor],
        pool: HostPool,
        batch_api: bool | None = None,
    ) -> None:
        """``batch_api`` None: ``cuMemcpyBatchAsync`` where the driver has it."""
        super().__init__(layout, kv_caches, pool)
        drv = cuda_driver.driver()
        self._drv = drv
        self._ctx = cuda_driver.primary_context(self.device_index)
        version = cuda_driver.check(drv.cuDriverGetVersion(), "cuDriverGetVersion")
        has_batch = hasattr(drv, "cuMemcpyBatchAsync") and version >= _BATCH_API_VERSION
        self.batch_api = has_batch if batch_api is None else batch_api and has_batch
        self._mergeable = layout.block_stride == layout.geometry.page_bytes
        attrs = drv.CUmemcpyAttributes()
        attrs.srcAccessOrder = drv.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
        attrs.flags = drv.CUmemcpyFlags.CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
        self._attrs = [attrs]
        n = layout.geometry.num_layers
        self._layer_ptrs = np.asarray(self.layer_ptrs, dtype=np.int64)[:, None]
        self._layer_rows = (np.arange(n, dtype=np.int64) * layout.geometry.blocks_per_chunk)[
            :, None
        ]

    def _copy(self, blocks: np.ndarray, rows: np.ndarray, to_pool: bool, layers: range) -> None:
        g = self.layout.geometry
        moved = blocks != NO_BLOCK
        block0, row0, length = merge_runs(blocks[moved], rows[moved], self._mergeable)
        ptrs, layer_rows = self._layer_ptrs[layers], self._layer_rows[layers]
        dev = ptrs + block0[None, :] * self.layout.block_stride  # [layers, runs]
        host = self.pool_ptr + (row0[None, :] + layer_rows) * g.page_bytes
        sizes = np.broadcast_to(length * g.page_bytes, dev.shape)
        # In pool order: sequential host memory moves faster than scattered pages.
        order = np.argsort(host, axis=None)
        src, dst = (dev, host) if to_pool else (host, dev)
        flat = src.ravel()[order], dst.ravel()[order], sizes.ravel()[order]
        cuda_driver.make_current(self._ctx)
        stream = self._drv.CUstream(torch.cuda.current_stream(self.device).cuda_stream)
        issue = self._issue_batch if self.batch_api else self._issue_each
        for i in range(0, dev.size, BATCH):
            issue(stream, *(a[i : i + BATCH].tolist() for a in flat))

    def _issue_batch(self, stream: Any, src: list[int], dst: list[int], sizes: list[int]) -> None:
        ptr = self._drv.CUdeviceptr
        cuda_driver.check(
            self._drv.cuMemcpyBatchAsync(
                list(map(ptr, dst)),
                list(map(ptr, src)),
                sizes,
                len(sizes),
                self._attrs,
                [0],
                1,
                stream,
            ),
            "cuMemcpyBatchAsync",
        )

    def _issue_each(self, stream: Any, src: list[int], dst: list[int], sizes: list[int]) -> None:
        copy: Any = self._drv.cuMemcpyAsync
        ptr = self._drv.CUdeviceptr
        for s, d, n in zip(src, dst, sizes, strict=True):
            cuda_driver.check(copy(ptr(d), ptr(s), n, stream), "cuMemcpyAsync")
