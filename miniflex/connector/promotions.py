"""A load's SSD reads (promotions) on one rank: read them, or wait for the rank that does.

A sharded cache's rank reads its own shard from its own SSD store. A
replicated (MLA) cache has one store and one pool for all ranks: rank 0 reads
each promoted chunk into the shared slot and publishes it in the pool's
ledger; the other ranks wait for that, then copy the slot like any CPU hit.
Either way the result is ``(keys that failed, seconds)``, and a failed key's
blocks become load errors on that rank (vLLM recomputes them on every rank).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from miniflex.connector.job_runner import Promoted
from miniflex.errors import TransferError
from miniflex.plan import SlotCopy
from miniflex.shared_pool import SharedPool
from miniflex.ssd.copier import SSDCopier
from miniflex.types import ChunkKey

__all__ = ["PROMOTION_WAIT_S", "Promoter"]

PROMOTION_WAIT_S = 60.0
"""Longest a rank waits for rank 0's SSD read of a replicated chunk before failing it."""


class Promoter:
    """Runs the promotions of one load job, on the worker's read thread."""

    def __init__(self, ssd: SSDCopier | None, shared: SharedPool | None, writes: bool) -> None:
        self._ssd, self._shared, self._writes = ssd, shared, writes

    def promote(self, job_id: int, copies: Sequence[SlotCopy]) -> Promoted:
        """Raises TransferError where this rank has no SSD tier to read from."""
        if not self._writes:
            return self._await(job_id, copies)
        if self._ssd is None:
            raise TransferError("an SSD job reached a worker without ssd_dirs configured")
        failed: set[ChunkKey] = {c.key for c in copies}  # until read: nothing is there
        try:
            failed, seconds = self._ssd.promote(copies)
        finally:  # the other ranks wait for every slot, whatever happened here
            if self._shared is not None:
                for c in copies:
                    self._shared.publish(c.cpu, job_id, c.key not in failed)
        return failed, seconds

    def _await(self, job_id: int, copies: Sequence[SlotCopy]) -> Promoted:
        assert self._shared is not None, "only a replicated cache's ranks read another's chunks"
        t0 = time.perf_counter()
        failed = {
            c.key
            for c in copies
            if not self._shared.wait_published(c.cpu, job_id, PROMOTION_WAIT_S)
        }
        return failed, time.perf_counter() - t0
