"""SSD reads of a load inside a step: read layer by layer while the forward computes.

A SYNC or LAYERWISE load may promote SSD chunks into CPU slots
(``TransferJob.promotions``). Its reads start at ``start_load_kv``, on a thread of
their own, and run in parts of one layer's bytes: slots are laid out layer-major
(:mod:`miniflex.layout`), so part ``p`` of every chunk is layer ``p``, and the layer's
:class:`~miniflex.gpu.base.LayerGate` opens once that part of every chunk is in. The
mover copies a layer as soon as its gate is open (:meth:`KVMover.load_layerwise`), so
the disk reads layer ``l + 1`` while the GPU copies layer ``l`` and computes the layers
before it. A slot being written back to SSD is read into only once that write is done,
as for a promotion on the ssd-read lane.

Checksums cover a whole chunk, so they are checked only after the last part, when the
forward may already have read the chunk's first layers: a chunk that fails is
reported failed, its blocks are load errors, and vLLM recomputes them and drops what
that step computed from them, as for any in-step load that fails. Example::

    reads = StepReads(copier, guard, pool.slot_bytes, layout.geometry)
    read = reads.start(job)              # on vLLM's thread, at start_load_kv
    load = mover.load_layerwise(job.chunks, fence, read.gate)
    failed, seconds, error = read.join() # after the forward
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from miniflex.gpu.base import LayerGate
from miniflex.layout import ALIGN, KVGeometry
from miniflex.plan import TransferJob
from miniflex.ssd.copier import SSDCopier
from miniflex.ssd.files import slot_parts
from miniflex.types import ChunkKey
from miniflex.worker.slot_guard import SlotGuard

__all__ = ["DiskRead", "StepReads"]

logger = logging.getLogger(__name__)


@dataclass
class DiskRead:
    """One job's reads, in flight on their own thread until :meth:`join`."""

    gate: LayerGate
    keys: tuple[ChunkKey, ...]
    failed: set[ChunkKey] = field(default_factory=set)
    seconds: float = 0.0
    error: str = ""
    _thread: threading.Thread | None = None

    def join(self) -> tuple[set[ChunkKey], float, str]:
        """Wait for the reads: (keys that failed, seconds reading, an error that failed them
        all, or "")."""
        if self._thread is not None:
            self._thread.join()
        return self.failed, self.seconds, self.error


class StepReads:
    """Starts the in-step SSD reads of one worker (see the module docstring)."""

    def __init__(
        self, copier: SSDCopier, guard: SlotGuard, slot_bytes: int, geometry: KVGeometry
    ) -> None:
        """``geometry``: the chunks' layout; where one layer of a chunk is not a multiple of
        4 KiB (O_DIRECT's unit), chunks are read whole and every layer waits for them."""
        self._copier, self._guard = copier, guard
        self.num_layers = geometry.num_layers
        layer_bytes = geometry.blocks_per_chunk * geometry.page_bytes
        self.part_bytes = layer_bytes if layer_bytes % ALIGN == 0 else 0
        self._parts = len(slot_parts(slot_bytes, self.part_bytes))

    @property
    def io(self) -> str:
        """The SSD I/O backend the reads run on."""
        return self._copier.backend

    def start(self, job: TransferJob) -> DiskRead:
        """Start reading ``job``'s promotions into their CPU slots; returns at once."""
        read = DiskRead(LayerGate(self.num_layers), tuple(c.key for c in job.promotions))
        written = threading.Event()  # the target slots are not being written back any more
        self._guard.after({c.cpu for c in job.promotions}, written.set)
        read._thread = threading.Thread(
            target=self._run, args=(job, read, written), name="miniflex-step-read", daemon=True
        )
        read._thread.start()
        return read

    def _run(self, job: TransferJob, read: DiskRead, written: threading.Event) -> None:
        try:
            written.wait()
            t0 = time.perf_counter()
            on_part = lambda part: self._on_part(read.gate, part)  # noqa: E731
            read.failed, _ = self._copier.promote(job.promotions, self.part_bytes, on_part)
            read.seconds = time.perf_counter() - t0
        except Exception as exc:  # the worker boundary: every chunk is a load error
            read.failed, read.error = set(read.keys), str(exc)
            logger.error("MiniFlex in-step SSD read of %s failed: %s", job.req_id, exc)
        finally:
            read.gate.open_all()  # never leave the forward waiting

    def _on_part(self, gate: LayerGate, part: int) -> None:
        """Part ``part`` of every chunk is in: its layer (the last part: every layer)."""
        if part >= self._parts - 1:
            gate.open_all()
        else:
            gate.open_through(part)
