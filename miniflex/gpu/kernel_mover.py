"""The kernel mover: one CuPy RawKernel launch per call gathers/scatters every page.

The pool is pinned and mapped, so the kernel (``copy_pages.cu``) reads and
writes host memory over PCIe directly: no staging buffer, no copy engine,
and one launch for all chunks of all layers. It runs on few CTAs
(``DEFAULT_CTAS`` unless configured or tuned) so that vLLM's compute keeps
most SMs; a handful of CTAs with 16-byte accesses already fill PCIe. A
layerwise load, which the step's attention layers wait for, gets more
(:func:`layerwise_ctas`).

CuPy is imported when a mover is built, never at module import.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from miniflex.errors import TransferError
from miniflex.gpu.cuda_mover import CudaMover
from miniflex.gpu.pages import vector_width
from miniflex.layout import KVLayout
from miniflex.pool import HostPool

__all__ = [
    "DEFAULT_CTAS",
    "LAYERWISE_CTAS",
    "PAGES_PER_CTA",
    "THREADS",
    "UNROLL",
    "KernelMover",
    "compiled_kernel",
    "layerwise_ctas",
]

DEFAULT_CTAS = 2
"""CTAs per launch when neither ``kernel_ctas`` nor the tuning cache says otherwise.

2 CTAs move about as much as 4 or 16 (PCIe is the limit) while a bf16 matmul
running beside them is not measurably slower; more CTAs take SMs from the matmul
and slow it, the more so the more CTAs (docs/gpu.md). With 4, a batch of long
prompts with no reuse ran below vLLM alone, every chunk being stored.
"""

LAYERWISE_CTAS = 8
"""Most CTAs of a layerwise load's launches when neither ``kernel_ctas`` nor the tuning
cache says otherwise (see :func:`layerwise_ctas`)."""

PAGES_PER_CTA = 32
"""A layerwise load gets one CTA per this many pages of each layer (within the bounds)."""

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


def layerwise_ctas(pages_per_layer: int) -> int:
    """CTAs for one layer's launch of a layerwise load moving ``pages_per_layer`` pages.

    Every attention layer of the step waits for its layer of the load, so the
    load is the step's critical path and more CTAs pay off, as long as each has
    work: 8 CTAs move a long load layer by layer nearer PCIe's speed than 2 do
    (docs/benchmarks.md, "Components", "layer-by-layer loads"), while a single
    64-token chunk moves faster with 2. Hence one CTA per
    ``PAGES_PER_CTA`` pages, between ``DEFAULT_CTAS`` and ``LAYERWISE_CTAS``.
    """
    return max(DEFAULT_CTAS, min(LAYERWISE_CTAS, pages_per_layer // PAGES_PER_CTA))


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
        self._fixed_ctas = ctas is not None  # configured or tuned: every launch uses it
        self._kernel = compiled_kernel(self.vec, UNROLL, self.device_index)
        self._cupy_streams: dict[int, Any] = {}
        self._layers = torch.tensor(self.layer_ptrs, dtype=torch.int64, device=self.device)
        self._host_table = torch.empty((0, 2), dtype=torch.int64)
        self._dev_table = torch.empty((0, 2), dtype=torch.int64, device=self.device)

    def _table(self, blocks: np.ndarray, rows: np.ndarray) -> torch.Tensor:
        """Upload the ``(block, row)`` pairs on the current stream; returns the device copy.

        The buffers are reused: only for calls on ``self.stream``, each of
        which has completed before the next starts.
        """
        host, dev = self._filled_table(blocks, rows)
        dev[: len(blocks)].copy_(host[: len(blocks)], non_blocking=True)
        return dev

    def _filled_table(
        self, blocks: np.ndarray, rows: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The reused pinned host and device ``[cap, 2]`` int64 tables (grown to hold the
        pairs), the host one holding the ``(block, row)`` pairs; the device one not yet."""
        n = len(blocks)
        if self._host_table.shape[0] < n:
            cap = max(n, 2 * self._host_table.shape[0], 1024)
            self._host_table = torch.empty((cap, 2), dtype=torch.int64, pin_memory=True)
            self._dev_table = torch.empty((cap, 2), dtype=torch.int64, device=self.device)
        host = self._host_table.numpy()
        host[:n, 0] = blocks
        host[:n, 1] = rows
        return self._host_table, self._dev_table

    def _fresh_table(self, blocks: np.ndarray, rows: np.ndarray) -> torch.Tensor:
        """A table of its own for a call that returns before its copies run.

        torch's pinned-memory allocator does not hand the staging host memory
        out again until the upload queued from it has run, and the device
        copy is freed back to the current stream, after the kernels using it.
        """
        host = torch.from_numpy(np.stack([blocks, rows], axis=1)).pin_memory()
        return host.to(self.device, non_blocking=True)

    def _copy(self, blocks: np.ndarray, rows: np.ndarray, to_pool: bool, layers: range) -> None:
        table = self._table(blocks, rows)
        self._launch(table.data_ptr(), len(blocks), to_pool, layers, self.pool_ptr, self.ctas)

    def _load_by_layer(self, blocks: np.ndarray, rows: np.ndarray) -> Iterator[int]:
        table = self._fresh_table(blocks, rows)  # one upload serves every layer
        ctas = self.ctas if self._fixed_ctas else layerwise_ctas(len(blocks))
        for layer in range(self.layout.geometry.num_layers):
            self._launch(
                table.data_ptr(), len(blocks), False, range(layer, layer + 1), self.pool_ptr, ctas
            )
            yield layer

    def _launch(
        self, table: int, entries: int, to_pool: bool, layers: range, pool: int, ctas: int
    ) -> None:
        """One launch on the current stream: ``entries`` table rows (whole chunks), ``layers``.

        ``table`` is the device address of the first ``(block, row)`` pair and
        ``pool`` the device address of row 0 of the pool (or of a staging
        buffer laid out like it).
        """
        import cupy

        g = self.layout.geometry
        items = entries * len(layers)
        args = (
            np.uint64(self._layers.data_ptr()),
            np.uint64(table),
            np.uint64(pool),
            np.int64(entries // g.blocks_per_chunk),
            np.int32(g.blocks_per_chunk),
            np.int32(layers.start),
            np.int32(len(layers)),
            np.int64(self.layout.block_stride),
            np.int64(g.page_bytes),
            np.int32(1 if to_pool else 0),
        )
        with cupy.cuda.Device(self.device_index):
            self._kernel((max(1, min(ctas, items)),), (THREADS,), args, stream=self._cupy_stream())

    def _cupy_stream(self) -> Any:
        """CuPy's handle on the current torch stream (made once per stream)."""
        import cupy

        current = torch.cuda.current_stream(self.device)
        view = self._cupy_streams.get(current.cuda_stream)
        if view is None:
            view = _cupy_view(cupy, current, self.device_index)
            self._cupy_streams[current.cuda_stream] = view
        return view
