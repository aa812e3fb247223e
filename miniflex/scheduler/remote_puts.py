"""Which chunks the workers put to the remote store (``remote_write``): the scheduler's side.

The scheduler decides what is put, the workers put it (:mod:`miniflex.remote.uploader`,
asynchronously, never awaited by a job's result):

* ``through``: a STORE job's chunks, once the workers have copied them into CPU
  slots (:meth:`RemotePuts.through`);
* ``back``: the chunks the CPU tier evicts, queued here by the tier stack's eviction
  hook (:meth:`RemotePuts.evicted`, while the slot still holds the chunk) and sent in
  the plan's first job, a DEMOTE (:meth:`RemotePuts.take_back`): the worker copies
  each slot before any later job of the plan overwrites it;
* ``off``, or no remote tier: nothing.

Example::

    puts = RemotePuts("back")
    stack = TierStack(..., on_cpu_evict=puts.evicted)
    job_puts = puts.take_back(stats)   # RemoteCopy per evicted chunk, counted
"""

from __future__ import annotations

from miniflex.plan import RemoteCopy
from miniflex.stats import TransferStats
from miniflex.types import ChunkKey, SlotId

__all__ = ["RemotePuts"]


class RemotePuts:
    """Puts to the remote store as ``mode`` (``remote_write``) wants them; scheduler side."""

    def __init__(self, mode: str, chunk_bytes: int = 0) -> None:
        """``mode``: ``through``, ``back`` or ``off`` (also for an engine with no remote tier);
        ``chunk_bytes``: a chunk's KV bytes on all ranks together (counted per put)."""
        self.mode = mode
        self.chunk_bytes = chunk_bytes
        self._back: list[RemoteCopy] = []  # evicted from CPU, to put (mode back)

    def evicted(self, key: ChunkKey, slot: SlotId) -> None:
        """The CPU tier's eviction hook: with ``back``, put the chunk before its slot is reused."""
        if self.mode == "back":
            self._back.append(RemoteCopy(key, slot))

    def take_back(self, stats: TransferStats) -> tuple[RemoteCopy, ...]:
        """The write-back puts queued since the last call (counted in ``stats``)."""
        out, self._back = tuple(self._back), []
        stats.remote_puts += len(out)
        stats.remote_put_bytes += len(out) * self.chunk_bytes
        return out

    def through(self, chunks: int, stats: TransferStats) -> bool:
        """Whether a STORE of ``chunks`` chunks puts them too (counted in ``stats`` if so)."""
        if self.mode != "through":
            return False
        stats.remote_puts += chunks
        stats.remote_put_bytes += chunks * self.chunk_bytes
        return True

    @property
    def pending(self) -> bool:
        """Write-back puts wait for the next plan."""
        return bool(self._back)

    def clear(self) -> None:
        """A reset: the queued write-back puts are dropped (pre-reset bytes are never put)."""
        self._back.clear()
