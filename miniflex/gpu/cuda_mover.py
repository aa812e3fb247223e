"""What the CUDA movers share: checks, the pinned pool, streams, ordering.

Each CUDA mover owns one stream for :meth:`store`/:meth:`load`. A copy waits
there for the caller's fence (an event recorded on vLLM's stream when the job
was queued), runs, records an event, and the call returns once that event has
completed, so the destination may be read at once (the KVMover contract).
Only the transfer thread waits; vLLM's stream never does.

:meth:`load_layerwise` runs on a second stream of its own, called from vLLM's
thread: it queues one copy per layer, records an event after each, and
returns at once; :meth:`CudaLayerwiseLoad.wait_layer` makes vLLM's stream
wait for that layer's event only.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch

from miniflex.errors import TransferError
from miniflex.gpu import pinning
from miniflex.gpu.base import DoneLoad, KVMover, LayerGate, LayerwiseLoad
from miniflex.gpu.pages import NO_BLOCK, page_table
from miniflex.layout import KVLayout
from miniflex.plan import ChunkMove
from miniflex.pool import HostPool

__all__ = ["CudaLayerwiseLoad", "CudaMover", "check_cuda_caches", "done_event"]


def done_event() -> torch.cuda.Event:
    """The event a ``store``/``load`` waits for: a *blocking* one, so the waiting thread sleeps.

    CUDA's default wait spins a CPU core until the copy ends: the transfer thread then
    spends most of a batch round spinning, and MiniFlex lost throughput against vLLM alone
    with no reuse where blocking waits lost none (why spinning slowed vLLM's thread was not
    established). The copies waited for take milliseconds, so the wake-up latency does not
    matter.
    """
    return torch.cuda.Event(blocking=True)


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
        self.layer_stream = torch.cuda.Stream(self.device)  # load_layerwise, vLLM's thread

    def fence(self) -> object:
        event = torch.cuda.Event(blocking=True)  # waited for by wait_for: sleep, not spin
        event.record(torch.cuda.current_stream(self.device))
        return event

    def store(self, chunks: Sequence[ChunkMove], after: object = None) -> int:
        return self._move(chunks, after, to_pool=True)

    def load(self, chunks: Sequence[ChunkMove], after: object = None) -> int:
        return self._move(chunks, after, to_pool=False)

    def _pages(self, chunks: Sequence[ChunkMove], after: object) -> tuple[np.ndarray, ...]:
        """The validated page table of a call, and a check of ``after``."""
        g = self.layout.geometry
        if after is not None and not isinstance(after, torch.cuda.Event):
            raise TransferError(f"'after' must be a marker from fence(), got {type(after)}")
        return page_table(chunks, g.blocks_per_chunk, self.rows_per_slot, self.layout.num_blocks)

    def _moved_bytes(self, blocks: np.ndarray) -> int:
        """Bytes a call with this page table moves (every layer of each page it names)."""
        g = self.layout.geometry
        return int(np.count_nonzero(blocks != NO_BLOCK)) * g.num_layers * g.page_bytes

    def _move(self, chunks: Sequence[ChunkMove], after: object, to_pool: bool) -> int:
        g = self.layout.geometry
        blocks, rows = self._pages(chunks, after)
        nbytes = self._moved_bytes(blocks)
        if nbytes == 0:
            return 0
        done = done_event()
        try:
            with torch.cuda.device(self.device_index), torch.cuda.stream(self.stream):
                if after is not None:
                    self.stream.wait_event(after)
                self._copy(blocks, rows, to_pool, range(g.num_layers))
                done.record(self.stream)
            done.synchronize()
        except RuntimeError as exc:  # CUDA errors from torch, CuPy or the driver
            raise TransferError(f"{type(self).__name__} copy failed: {exc}") from exc
        return nbytes

    def load_layerwise(
        self, chunks: Sequence[ChunkMove], after: object = None, gate: LayerGate | None = None
    ) -> LayerwiseLoad:
        g = self.layout.geometry
        blocks, rows = self._pages(chunks, after)
        nbytes = self._moved_bytes(blocks)
        if nbytes == 0:
            return DoneLoad(0)
        if gate is not None:
            return GatedLayerwiseLoad(self, self._load_by_layer(blocks, rows), after, gate, nbytes)
        events = []
        try:
            with torch.cuda.device(self.device_index), torch.cuda.stream(self.layer_stream):
                if after is not None:
                    self.layer_stream.wait_event(after)
                for _ in self._load_by_layer(blocks, rows):
                    event = torch.cuda.Event()
                    event.record(self.layer_stream)
                    events.append(event)
        except RuntimeError as exc:
            raise TransferError(f"{type(self).__name__} layerwise load failed: {exc}") from exc
        assert len(events) == g.num_layers, "one event per layer"
        return CudaLayerwiseLoad(self.device, events, nbytes)

    def _load_by_layer(self, blocks: np.ndarray, rows: np.ndarray) -> Iterator[int]:
        """Queue each layer's load on the current stream, yielding after each (layer 0 first).

        This default calls :meth:`_copy` per layer; movers whose ``_copy``
        reuses host-side buffers between calls override it, since nothing
        here waits for one layer before the next is queued.
        """
        for layer in range(self.layout.geometry.num_layers):
            self._copy(blocks, rows, False, range(layer, layer + 1))
            yield layer

    @abstractmethod
    def _copy(self, blocks: np.ndarray, rows: np.ndarray, to_pool: bool, layers: range) -> None:
        """Enqueue the copy of ``layers``' pages on the current stream (``self.stream``).

        ``(blocks, rows)`` is the validated :func:`~miniflex.gpu.pages.page_table`
        of the call: ``blocks_per_chunk`` entries per chunk, ``NO_BLOCK`` where a
        partial chunk moves nothing. Must not wait for the copy.
        """


class CudaLayerwiseLoad(LayerwiseLoad):
    """Per-layer events of a load queued by :meth:`CudaMover.load_layerwise`."""

    def __init__(self, device: torch.device, events: list[torch.cuda.Event], nbytes: int) -> None:
        self._device = device
        self._events = events
        self.nbytes = nbytes

    def wait_layer(self, layer: int) -> None:
        torch.cuda.current_stream(self._device).wait_event(self._events[layer])

    def wait(self) -> int:
        try:
            self._events[-1].synchronize()  # one stream: the last layer's event covers all
        except RuntimeError as exc:
            raise TransferError(f"layerwise load failed: {exc}") from exc
        return self.nbytes


class GatedLayerwiseLoad(LayerwiseLoad):
    """A layerwise load whose slots are still being read into (see :class:`LayerGate`).

    A layer's copy is queued on the mover's layer stream once the gate opens it: when
    the forward waits for that layer, or earlier, whenever a wait finds later layers
    already open. The forward's wait for a layer not yet read blocks vLLM's thread, while
    the GPU computes the layers queued before it. vLLM's thread only.
    """

    def __init__(
        self, mover: CudaMover, copies: Iterator[int], after: object, gate: LayerGate, nbytes: int
    ) -> None:
        self._mover, self._copies, self._after, self._gate = mover, copies, after, gate
        self._events: list[torch.cuda.Event] = []
        self.nbytes = nbytes
        self._queue_through(-1)  # whatever is in already

    def _queue_through(self, layer: int) -> None:
        """Queue the copies of layers ``0..layer`` (waiting for the gate), then of those
        after it that are in already."""
        m = self._mover
        while (nxt := len(self._events)) < self._gate.num_layers:
            if nxt > layer and self._gate.opened() <= nxt:
                return
            self._gate.wait(nxt)
            try:
                with torch.cuda.device(m.device_index), torch.cuda.stream(m.layer_stream):
                    if nxt == 0 and self._after is not None:
                        m.layer_stream.wait_event(self._after)
                    next(self._copies)
                    event = torch.cuda.Event()
                    event.record(m.layer_stream)
            except RuntimeError as exc:
                raise TransferError(f"layerwise load of layer {nxt} failed: {exc}") from exc
            self._events.append(event)

    def wait_layer(self, layer: int) -> None:
        self._queue_through(layer)
        torch.cuda.current_stream(self._mover.device).wait_event(self._events[layer])

    def wait(self) -> int:
        self._queue_through(self._gate.num_layers - 1)
        try:
            self._events[-1].synchronize()
        except RuntimeError as exc:
            raise TransferError(f"layerwise load failed: {exc}") from exc
        return self.nbytes
