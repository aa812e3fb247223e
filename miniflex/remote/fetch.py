"""A load's remote fetches on one worker: the store's verified bytes into fresh CPU slots.

The worker's side of a remote hit, run on its read thread (like SSD
promotions) before the load's GPU copies. Each rank fetches its own shard's
value into the slot the scheduler allocated; a fetch that fails (a miss, the
store down or slow, a value that fails verification, which the store deletes)
is reported in the job's failed keys, so its blocks become load errors and
vLLM recomputes them::

    fetcher = RemoteFetcher(store, pool)
    failed, seconds = fetcher.fetch(job.remote)
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from miniflex.plan import RemoteCopy
from miniflex.pool import HostPool
from miniflex.remote.base import RemoteStore
from miniflex.types import ChunkKey

__all__ = ["RemoteFetcher"]


class RemoteFetcher:
    """Fetches chunks from one shard's store into this rank's CPU pool."""

    def __init__(self, store: RemoteStore, pool: HostPool) -> None:
        self.store = store
        self._pool = pool

    def fetch(self, copies: Sequence[RemoteCopy]) -> tuple[set[ChunkKey], float]:
        """Fill each copy's CPU slot: (keys that failed, seconds the fetches took).

        A value must fill the slot exactly: one namespace has one chunk size, so a
        shorter one is not this chunk (the slot's bytes are then unspecified).
        """
        t0 = time.perf_counter()
        failed: set[ChunkKey] = set()
        for c in copies:
            slot = memoryview(self._pool.slot(c.cpu)).cast("B")
            if self.store.get_into(c.key, slot) != len(slot):
                failed.add(c.key)
        return failed, time.perf_counter() - t0
