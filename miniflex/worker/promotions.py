"""A load's reads on one rank (SSD promotions, remote fetches): do them, or await them.

A sharded cache's rank reads its own shard from its own SSD store. A
replicated (MLA) cache has one store and one pool for all ranks: rank 0 reads
each promoted chunk into the shared slot and publishes it in the pool's
ledger; the other ranks wait for that, then copy the slot like any CPU hit.
Remote fetches go the same way. Either way the result is ``(keys that failed,
SSD seconds, remote seconds)``, and a failed key's blocks become load errors on
that rank (vLLM recomputes them on every rank).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from miniflex.errors import TransferError
from miniflex.plan import RemoteCopy, SlotCopy
from miniflex.remote.fetch import Arrived, RemoteFetcher
from miniflex.shared_pool import SharedPool
from miniflex.ssd.copier import SSDCopier
from miniflex.types import ChunkKey
from miniflex.worker.job_runner import Promoted

__all__ = ["PROMOTION_WAIT_S", "Promoter"]

PROMOTION_WAIT_S = 60.0
"""Longest a rank waits for rank 0's SSD read of a replicated chunk before failing it."""


class Promoter:
    """Runs the reads of one load job: SSD promotions (the ssd-read lane), remote fetches
    (the remote-fetch lane)."""

    def __init__(
        self,
        ssd: SSDCopier | None,
        shared: SharedPool | None,
        writes: bool,
        fetcher: RemoteFetcher | None = None,
    ) -> None:
        self._ssd, self._shared, self._writes = ssd, shared, writes
        self._fetcher = fetcher

    def promote(
        self,
        job_id: int,
        copies: Sequence[SlotCopy],
        fetches: Sequence[RemoteCopy] = (),
        arrived: Arrived | None = None,
    ) -> Promoted:
        """Raises TransferError where this rank has no SSD tier (or remote store) to read from.
        ``arrived``: told of each fetch as soon as it ended (not of SSD reads, nor on a rank
        that awaits another's reads)."""
        reads = (*copies, *fetches)
        if not self._writes:
            failed, seconds = self._await(job_id, reads)
            return failed, seconds, 0.0
        if copies and self._ssd is None:
            raise TransferError("an SSD job reached a worker without ssd_dirs configured")
        if fetches and self._fetcher is None:
            raise TransferError("a remote fetch reached a worker without remote_url configured")
        failed: set[ChunkKey] = set()
        ssd_s = remote_s = 0.0
        read_all = False  # a read that raised leaves every slot unknown: all fail
        try:
            if copies:
                bad, ssd_s = self._ssd.promote(copies)  # type: ignore[union-attr]
                failed |= bad
            if fetches:
                bad, remote_s = self._fetcher.fetch(fetches, arrived)  # type: ignore[union-attr]
                failed |= bad
            read_all = True
        finally:  # the other ranks wait for every slot, whatever happened here
            if self._shared is not None:
                for c in reads:
                    self._shared.publish(c.cpu, job_id, read_all and c.key not in failed)
        return failed, ssd_s, remote_s

    def _await(
        self, job_id: int, copies: Sequence[SlotCopy | RemoteCopy]
    ) -> tuple[set[ChunkKey], float]:
        assert self._shared is not None, "only a replicated cache's ranks read another's chunks"
        t0 = time.perf_counter()
        failed = {
            c.key
            for c in copies
            if not self._shared.wait_published(c.cpu, job_id, PROMOTION_WAIT_S)
        }
        return failed, time.perf_counter() - t0
