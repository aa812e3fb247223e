"""The mover interface: copies chunks between vLLM's paged KV cache and the CPU pool."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from miniflex.plan import ChunkMove

__all__ = ["KVMover"]


class KVMover(ABC):
    """Moves whole chunks, in both directions, for one worker (one TP rank).

    Called from the worker's transfer thread (or stream), never from the
    scheduler. Slots named in a call are pinned by the scheduler for its
    duration, and the vLLM blocks are not reused until the job is reported
    finished, so a mover needs no locking of its own. Both methods return the
    number of bytes moved once the copy is complete (the destination may be read
    at once), and raise :class:`miniflex.errors.TransferError` on failure; a
    raise means the destination may hold partial data.
    """

    def fence(self) -> object:
        """Mark the device work queued so far; called on vLLM's thread when jobs are queued.

        ``store``/``load`` given this marker as ``after`` start only once that
        work is done (on CUDA: an event recorded on vLLM's current stream). None
        where copies are naturally ordered (host memory).
        """
        return None

    @abstractmethod
    def store(self, chunks: Sequence[ChunkMove], after: object = None) -> int:
        """Copy each chunk's vLLM blocks into its pool slot (device -> host)."""

    @abstractmethod
    def load(self, chunks: Sequence[ChunkMove], after: object = None) -> int:
        """Copy each chunk's pool slot into its vLLM blocks (host -> device)."""
