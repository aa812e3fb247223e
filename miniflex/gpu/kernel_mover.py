"""The kernel mover: one CuPy RawKernel launch per call gathers/scatters every page.

The pool is pinned and mapped, so the kernel (``copy_pages.cu``) reads and
writes host memory over PCIe directly: no staging buffer, no copy engine,
and one launch for all chunks of all layers. It runs on few CTAs
(``DEFAULT_CTAS`` unless configured or tuned) so that vLLM's compute keeps
most SMs; a handful of CTAs with 16-byte accesses already fill PCIe.

CuPy is imported when a mover is built, never at module import.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from miniflex.errors import TransferError
from miniflex.gpu.cuda_mover import CudaMover
from miniflex.gpu.pages import vector_width
from miniflex.layout import KVLayout
from miniflex.pool import HostPool

__all__ = ["DEFAULT_CTAS", "THREADS", "UNROLL", "KernelMover", "compiled_kernel"]

DEFAULT_CTAS = 2
"""CTAs per launch when neither ``kernel_ctas`` nor the tuning cache says otherwise.

On an H200, 2 CTAs move within about 2% of what 4 or 16 move (PCIe is the
limit) while a bf16 matmul running beside them is not measurably slower; with
4 it slowed by 4-14%, with 16 by about 50% (docs/gpu.md). With 4, a batch of
long prompts with no reuse ran 15% below vLLM alone, every chunk being stored.
"""

THREADS = 512
UNROLL = 8  # 512 threads x 8 x 16 B: a 64 KiB page in flight per CTA
_SOURCE = Path(__file__).with_name("copy_pages.cu")


@functools.cache
def compiled_kernel(vec: int, unroll: int, device_index: int) -> Any:
    """The ``miniflex_copy_pages`` kernel for one access width and GPU, compiled once."""
    import cupy

    module = cupy.RawModule(
        code=_SOURCE.read_text(),
        options=("-std=c++17", f"-DVEC={vec}", f"-DUNROLL={unroll}"),
    )
    with cupy.cuda.Device(device_index):
        return module.get_function("miniflex_copy_pages")


def _cupy_view(cupy: Any, stream: torch.cuda.Stream, device_index: int) -> Any:
    """CuPy's handle on a torch stream (the kernel is launched on the mover's stream)."""
    if not hasattr(cupy.cuda, "ExternalStream"):
        return cupy.cuda.Stream.from_external(stream)
    with warnings.catch_warnings():  # CuPy 14 deprecates it for Stream.from_external
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(stream.cuda_stream, device_index)


class KernelMover(CudaMover):
    """Moves chunks with one copy kernel per call into mapped pinned memory."""

    def __init__(
        self,
        layout: KVLayout,
        kv_caches: Mapping[str, torch.Tensor],
        pool: HostPool,
        ctas: int | None = None,
        vec: int | None = None,
    ) -> None:
        super().__init__(layout, kv_caches, pool)
        import cupy

        g = layout.geometry
        aligned = {
            f"layer {n} address": ptr for n, ptr in zip(kv_caches, self.layer_ptrs, strict=True)
        }
        self.vec = vector_width(
            vec,
            page_bytes=g.page_bytes,
            block_stride=layout.block_stride,
            pool_address=self.pool_ptr,
            **aligned,
        )
        if ctas is not None and ctas < 1:
            raise TransferError(f"the kernel mover needs at least one CTA, got {ctas}")
        self.ctas = ctas or DEFAULT_CTAS
        self._kernel = compiled_kernel(self.vec, UNROLL, self.device_index)
        self._cupy_stream = _cupy_view(cupy, self.stream, self.device_index)
        self._layers = torch.tensor(self.layer_ptrs, dtype=torch.int64, device=self.device)
        self._host_table = torch.empty((0, 2), dtype=torch.int64)
        self._dev_table = torch.empty((0, 2), dtype=torch.int64, device=self.device)

    def _table(self, blocks: np.ndarray, rows: np.ndarray) -> torch.Tensor:
        """Upload the ``(block, row)`` pairs on the mover's stream; returns the device copy."""
        n = len(blocks)
        if self._host_table.shape[0] < n:
            cap = max(n, 2 * self._host_table.shape[0], 1024)
            self._host_table = torch.empty((cap, 2), dtype=torch.int64, pin_memory=True)
            self._dev_table = torch.empty((cap, 2), dtype=torch.int64, device=self.device)
        host = self._host_table.numpy()  # reused: the previous call has completed
        host[:n, 0] = blocks
        host[:n, 1] = rows
        self._dev_table[:n].copy_(self._host_table[:n], non_blocking=True)
        return self._dev_table

    def _copy(self, blocks: np.ndarray, rows: np.ndarray, to_pool: bool) -> None:
        import cupy

        g = self.layout.geometry
        table = self._table(blocks, rows)
        items = len(blocks) * g.num_layers
        args = (
            np.uint64(self._layers.data_ptr()),
            np.uint64(table.data_ptr()),
            np.uint64(self.pool_ptr),
            np.int64(len(blocks) // g.blocks_per_chunk),
            np.int32(g.blocks_per_chunk),
            np.int32(g.num_layers),
            np.int64(self.layout.block_stride),
            np.int64(g.page_bytes),
            np.int32(1 if to_pool else 0),
        )
        with cupy.cuda.Device(self.device_index), self._cupy_stream:
            self._kernel((min(self.ctas, items),), (THREADS,), args, stream=self._cupy_stream)
