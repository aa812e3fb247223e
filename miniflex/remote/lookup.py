"""Which chunks after a local hit the remote store holds: the scheduler's remote lookup.

The remote tier is not indexed locally (a fleet's replicas write to it, and
its server evicts on its own), so a lookup asks the store, one ``exists``
round trip per TP shard for the keys after the local run. A chunk counts only
if every rank's shard is there: one plan drives all ranks, so a chunk one rank
lacks would be a hit the ranks disagree on (as for chunks recovered from SSD).

vLLM may ask about one request several times (while it waits for blocks), so
each ask returns a :class:`RemoteAnswer` that the scheduler keeps on the request and
hands back with the next ask: the store is asked at most once per request in ``ttl_s``
(for the same keys), and every ask is bounded by ``remote_timeout_s`` (after a failure,
by the store's fast-fail window). The answer goes with the request; a failed fetch
drops it so that the next ask goes to the store. Scheduler side, one thread::

    lookup = RemoteLookup([store_rank0, store_rank1])
    answer = lookup.ask(keys[local_run:], answer)   # answer.held: leading keys every shard holds
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from miniflex.remote.base import RemoteStats, RemoteStore
from miniflex.types import ChunkKey

__all__ = ["ANSWER_TTL_S", "RemoteAnswer", "RemoteLookup"]

ANSWER_TTL_S = 1.0
"""How long a request's answer is reused before the store is asked again."""


@dataclass(frozen=True)
class RemoteAnswer:
    """What the store said of one request's keys after its local run."""

    first: ChunkKey | None
    """The first key asked about (None: none was)."""
    asked: int
    held: int
    """How many leading keys of those asked every shard's store holds."""
    at: float
    """When it was asked (the lookup's clock)."""


class RemoteLookup:
    """Prefix lookups in the remote store across every TP shard's namespace."""

    def __init__(
        self,
        stores: Sequence[RemoteStore],
        ttl_s: float = ANSWER_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``stores``: one per shard that holds bytes (rank 0's alone for a replicated
        cache), each scoped to its shard's namespace; this object owns and closes them."""
        assert stores, "a remote lookup needs the store of every shard"
        self.stores = list(stores)
        self._ttl_s = ttl_s
        self._clock = clock
        self.seconds = 0.0
        """Wall time spent asking the store (the scheduler waited that long)."""

    def ask(self, keys: Sequence[ChunkKey], last: RemoteAnswer | None = None) -> RemoteAnswer:
        """How many leading ``keys`` every shard's store holds (held 0 when it cannot
        answer). ``last``: the request's previous answer, returned as it is while it is
        younger than ``ttl_s`` and was asked about the same keys.

        A hint: a chunk may be evicted or found corrupt before it is fetched;
        the fetch then fails and vLLM recomputes its blocks.
        """
        now = self._clock()
        if not keys:
            return RemoteAnswer(None, 0, 0, now)
        if (
            last is not None
            and now - last.at < self._ttl_s
            and (last.first, last.asked) == (keys[0], len(keys))
        ):
            return last
        t0 = time.perf_counter()
        held = len(keys)
        for store in self.stores:
            found = store.exists(keys[:held])
            held = next((i for i, f in enumerate(found) if not f), len(found))
            if held == 0:
                break
        self.seconds += time.perf_counter() - t0
        return RemoteAnswer(keys[0], len(keys), held, now)

    def held_each(self, keys: Sequence[ChunkKey]) -> list[bool]:
        """Whether every shard's store holds each of ``keys`` (not only a leading run: a
        sliding-window group needs the chunks of a window, not a prefix). One round trip
        per shard, bounded like ``ask``; all False where a store cannot answer."""
        if not keys:
            return []
        t0 = time.perf_counter()
        held = [True] * len(keys)
        for store in self.stores:
            held = [h and f for h, f in zip(held, store.exists(keys), strict=True)]
            if not any(held):
                break
        self.seconds += time.perf_counter() - t0
        return held

    def stats(self) -> RemoteStats:
        """The counters of the scheduler's stores, summed (``down`` if any is down)."""
        snaps = [s.stats() for s in self.stores]
        fields = {f: sum(getattr(s, f) for s in snaps) for f in RemoteStats.__dataclass_fields__}
        fields["down"] = any(s.down for s in snaps)
        return RemoteStats(**fields)

    def status(self) -> dict[str, Any]:
        """What ``miniflex inspect`` shows of the remote tier (the scheduler's view)."""
        s = self.stats()
        return {
            "url": self.stores[0].url,
            "shards": len(self.stores),
            "down": s.down,
            "lookups": s.lookups,
            "errors": s.errors,
            "timeouts": s.timeouts,
            "fast_fails": s.fast_fails,
            "reconnects": s.reconnects,
            "lookup_seconds": round(self.seconds, 6),
        }

    def close(self) -> None:
        for store in self.stores:
            store.close()
