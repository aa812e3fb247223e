"""A load's remote fetches on one worker: the store's verified bytes into fresh CPU slots.

The worker's side of a remote hit, run on its remote-fetch lane (beside the SSD
promotions' ssd-read lane) before the load's GPU copies. Each rank fetches its own shard's
value into the slot the scheduler allocated; a fetch that fails (a miss, the
store down or slow, a value that fails verification, which the store deletes)
is reported in the job's failed keys, so its blocks become load errors and
vLLM recomputes them. The chunks are fetched by ``streams`` threads at once,
each on a connection of its own with several requests in flight
(:meth:`RemoteStore.get_many_into`)::

    fetcher = RemoteFetcher(store, pool, streams=4)
    failed, seconds = fetcher.fetch(job.remote)
    fetcher.close()
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait

from miniflex.plan import RemoteCopy
from miniflex.pool import HostPool
from miniflex.remote.base import RemoteStore
from miniflex.remote.fetch_gate import FetchGate
from miniflex.types import ChunkKey

__all__ = ["Arrived", "RemoteFetcher", "auto_fetch_streams"]

Arrived = Callable[[RemoteCopy, bool], None]
"""Told of each copy as soon as its fetch ended: whether its slot holds the chunk, verified.
Called on the fetch threads, in order within a stream; it must not raise."""


def auto_fetch_streams(cpus: int | None) -> int:
    """``remote_fetch_streams=auto``: a quarter of the host's CPUs, 1 to 4.

    More connections pay only while the engine's own thread keeps a core busy
    (docs/benchmarks.md, "remote", has the measured figures); on a 2-core
    host one connection is the fastest and the engine thread leaves no core for
    more.
    """
    return max(1, min(4, (cpus or 1) // 4))


class RemoteFetcher:
    """Fetches chunks from one shard's store into this rank's CPU pool."""

    def __init__(self, store: RemoteStore, pool: HostPool, streams: int = 1) -> None:
        """``streams``: fetches in flight at once (1: one after another, on this thread)."""
        self.store = store
        self.pool = pool
        self.streams = streams
        self.gate = FetchGate()
        """Held for each fetch: this rank's uploader, given it, waits for the fetches."""
        self._threads = (
            ThreadPoolExecutor(streams, thread_name_prefix="miniflex-fetch")
            if streams > 1
            else None
        )

    def fetch(
        self, copies: Sequence[RemoteCopy], arrived: Arrived | None = None
    ) -> tuple[set[ChunkKey], float]:
        """Fill each copy's CPU slot: (keys that failed, seconds the fetches took).

        The copies are dealt to the streams in turn (stream ``s`` fetches copies
        ``s``, ``s + streams``, ...), each stream one batch of
        :meth:`RemoteStore.get_many_into` on a connection of its own; where the
        store spreads its keys over several servers (:meth:`RemoteStore.lanes`),
        each server's copies are dealt to streams of their own, so that the
        servers send at once. A value must fill the slot exactly: one namespace
        has one chunk size, so a shorter one is not this chunk (the slot's bytes
        are then unspecified). ``arrived``, if given, is told of each copy as soon as its
        fetch ended, so that its copy onward can start while the others arrive. If a stream
        raises, the others are waited for before the error propagates: no fetch thread
        writes a slot (or tells of one) after this returns.
        """
        t0 = time.perf_counter()
        shares = self._shares(copies)
        with self.gate.fetching():  # this rank's puts wait until the fetch is done
            if self._threads is None or len(shares) < 2:
                missed = [k for share in shares for k in self._fetch_share(share, arrived)]
            else:
                runs = [self._threads.submit(self._fetch_share, s, arrived) for s in shares]
                wait(runs)
                missed = [k for run in runs for k in run.result()]  # the first error, if any
        return set(missed), time.perf_counter() - t0

    def _shares(self, copies: Sequence[RemoteCopy]) -> list[Sequence[RemoteCopy]]:
        """The batches the streams fetch: the copies dealt round robin, per server."""
        lanes = self.store.lanes([c.key for c in copies]) if len(copies) > 1 else None
        groups: dict[Hashable, list[RemoteCopy]] = {}
        for i, c in enumerate(copies):
            groups.setdefault(0 if lanes is None else lanes[i], []).append(c)
        per_group = max(1, -(-self.streams // len(groups))) if groups else 1
        return [
            group[s::per_group]
            for group in groups.values()
            for s in range(min(per_group, len(group)))
        ]

    def _fetch_share(
        self, copies: Sequence[RemoteCopy], arrived: Arrived | None = None
    ) -> list[ChunkKey]:
        """The keys of ``copies`` whose fetch failed."""
        slots = [memoryview(self.pool.slot(c.cpu)).cast("B") for c in copies]

        def done(i: int, n: int | None) -> None:
            arrived(copies[i], n == len(slots[i]))  # type: ignore[misc]

        items = [(c.key, s) for c, s in zip(copies, slots, strict=True)]
        got = self.store.get_many_into(items, done if arrived is not None else None)
        return [c.key for c, n, s in zip(copies, got, slots, strict=True) if n != len(s)]

    def close(self) -> None:
        """Stop the fetch threads (after the fetches in flight); idempotent."""
        if self._threads is not None:
            self._threads.shutdown(wait=True)
