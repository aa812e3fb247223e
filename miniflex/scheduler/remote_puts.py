"""Which chunks the workers put to the remote store (``remote_write``): the scheduler's side.

The scheduler decides what is put, the workers put it (:mod:`miniflex.remote.uploader`,
asynchronously, never awaited by a job's result):

* ``through``: a STORE job's chunks, once the workers have copied them into CPU
  slots (:meth:`RemotePuts.through`);
* ``back``: the chunks the CPU tier evicts, as the tier stack's
  :class:`~miniflex.tiers.writeback.DemotionBatch` lists them (while each slot still
  holds its chunk), sent in the plan's first job, a DEMOTE (:meth:`RemotePuts.back`):
  the worker copies each slot before any later job of the plan overwrites it;
* ``off``, or no remote tier: nothing.

Example::

    puts = RemotePuts("back")
    stack = TierStack(..., keep_evictions=puts.mode == "back")
    job_puts = puts.back(stack.take_demotions().evicted, stats)  # counted RemoteCopy each
"""

from __future__ import annotations

from collections.abc import Sequence

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

    def back(
        self, evicted: Sequence[tuple[ChunkKey, SlotId]], stats: TransferStats
    ) -> tuple[RemoteCopy, ...]:
        """With ``back``, a put of each chunk the CPU tier ``evicted`` (``(key, slot)``, the
        slot still holding it), counted in ``stats``; otherwise none."""
        if self.mode != "back":
            return ()
        out = tuple(RemoteCopy(key, slot) for key, slot in evicted)
        stats.remote_puts += len(out)
        stats.remote_put_bytes += len(out) * self.chunk_bytes
        return out

    @property
    def takes_chunks(self) -> bool:
        """Whether every chunk stored is put too (``through``): then a chunk that finds no
        CPU slot is worth waiting for one, as the puts' copies free the slots."""
        return self.mode == "through"

    def through(self, chunks: int, stats: TransferStats) -> bool:
        """Whether a STORE of ``chunks`` chunks puts them too (counted in ``stats`` if so)."""
        if self.mode != "through":
            return False
        stats.remote_puts += chunks
        stats.remote_put_bytes += chunks * self.chunk_bytes
        return True
