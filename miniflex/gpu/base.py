"""The mover interface: copies chunks between vLLM's paged KV cache and the CPU pool."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence

from miniflex.errors import TransferError
from miniflex.plan import ChunkMove

__all__ = ["DoneLoad", "KVMover", "LayerGate", "LayerwiseLoad"]


class LayerwiseLoad(ABC):
    """A load issued layer by layer (:meth:`KVMover.load_layerwise`), still in flight.

    vLLM's thread calls :meth:`wait_layer` before each attention layer reads
    its KV, and :meth:`wait` once the step's forward has been issued.
    """

    @abstractmethod
    def wait_layer(self, layer: int) -> None:
        """Order the caller's work after layer ``layer``'s copies (0-based, vLLM's order).

        On CUDA this makes the caller's current stream wait for the layer's
        copy event: the CPU does not block, the GPU does only if the copy is
        behind. Where copies are synchronous it returns at once.
        """

    @abstractmethod
    def wait(self) -> int:
        """Block until every layer is copied; the bytes moved. TransferError on failure."""


class DoneLoad(LayerwiseLoad):
    """A layerwise load that completed before it was returned (synchronous movers)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def wait_layer(self, layer: int) -> None:
        return None

    def wait(self) -> int:
        return self.nbytes


class LayerGate:
    """Which layers of a load's chunks are in their pool slots yet, for a load whose chunks
    are still being read there (an SSD read in parts, one layer after another).

    The reading thread opens layers in order (:meth:`open_through`); a layerwise load
    copies a layer only once it is open (:meth:`wait`). Whoever reads must open every
    layer in the end, failed or not (:meth:`open_all`): a waiter is never left hanging.
    """

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self._open = 0
        self._cond = threading.Condition()

    def open_through(self, layer: int) -> None:
        """Layers ``0..layer`` are in."""
        with self._cond:
            self._open = max(self._open, min(layer + 1, self.num_layers))
            self._cond.notify_all()

    def open_all(self) -> None:
        self.open_through(self.num_layers - 1)

    def opened(self) -> int:
        """How many leading layers are in."""
        with self._cond:
            return self._open

    def wait(self, layer: int) -> None:
        """Block until layer ``layer`` is in (the interpreter lock released meanwhile)."""
        with self._cond:
            self._cond.wait_for(lambda: self._open > layer)


class KVMover(ABC):
    """Moves whole chunks, in both directions, for one worker (one TP rank).

    Called from the worker's transfer thread (or stream), never from the
    scheduler. Slots named in a call are pinned by the scheduler for its
    duration, and the vLLM blocks are not reused until the job is reported
    finished, so a mover needs no locking of its own. Both methods return the
    number of bytes moved once the copy is complete (the destination may be read
    at once), and raise :class:`miniflex.errors.TransferError` on failure; a
    raise means the destination may hold partial data.

    :meth:`load_layerwise` is the exception to "one thread": vLLM's thread
    may call it while the transfer thread runs :meth:`store`/:meth:`load`, on
    other slots and blocks; CUDA movers give it a stream of its own.
    """

    def fence(self) -> object:
        """Mark the device work queued so far; called on vLLM's thread when jobs are queued.

        ``store``/``load`` given this marker as ``after`` start only once that
        work is done (on CUDA: an event recorded on vLLM's current stream). None
        where copies are naturally ordered (host memory).
        """
        return None

    def wait_for(self, marker: object) -> None:
        """Block until the device work before ``marker`` (from :meth:`fence`) is done; the
        calling thread sleeps, without the interpreter lock (CUDA: a blocking event). None
        returns at once. TransferError if that work failed."""
        if marker is None:
            return
        try:
            marker.synchronize()  # type: ignore[attr-defined]
        except RuntimeError as exc:
            raise TransferError(f"the work before a fence failed: {exc}") from exc

    @abstractmethod
    def store(self, chunks: Sequence[ChunkMove], after: object = None) -> int:
        """Copy each chunk's vLLM blocks into its pool slot (device -> host)."""

    @abstractmethod
    def load(self, chunks: Sequence[ChunkMove], after: object = None) -> int:
        """Copy each chunk's pool slot into its vLLM blocks (host -> device)."""

    def load_layerwise(
        self, chunks: Sequence[ChunkMove], after: object = None, gate: LayerGate | None = None
    ) -> LayerwiseLoad:
        """Start a load layer by layer, layer 0 first, and return without waiting for it.

        Called on vLLM's thread before a forward that reads these blocks; the
        forward calls :meth:`LayerwiseLoad.wait_layer` before each layer, so
        layer ``l + 1`` copies while layer ``l`` computes. ``gate``: the slots are
        still being read into, a layer is copied only once the gate has opened it.
        Raises TransferError (before anything is queued) for chunks :meth:`load`
        would refuse. This default waits for the whole gate, loads everything at
        once and returns a finished load.
        """
        if gate is not None:
            gate.wait(gate.num_layers - 1)
        return DoneLoad(self.load(chunks, after))
