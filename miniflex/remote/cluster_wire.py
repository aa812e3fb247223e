"""Fetches from a Redis or Valkey Cluster on MiniFlex's own connections, each chunk from the
primary that owns its slot.

One server sends with one thread, and that thread, not the client, is the ceiling of a
fetch from one server (docs/design/remote-store.md, "Fetch"); a cluster's primaries send in
parallel. :class:`ClusterWire` routes each chunk by its key's hash slot through the
``redis`` cluster client's slot map (learned from the startup nodes on first use, as
every other call does) and fetches each primary's chunks over a
:class:`~miniflex.remote.wire_fetch.WireFetcher` of that primary's own connections.
:meth:`ClusterWire.lanes` tells a load's fetcher which primary each chunk lives on,
so that its streams fetch from different primaries at once
(:class:`~miniflex.remote.fetch.RemoteFetcher`).

While slots migrate, a primary answers ``MOVED`` (or ``ASK``) for a slot it no longer
serves: that chunk is a miss (recomputed) and the slot map is learned again before the
next fetch. A cluster that cannot be reached is a failed call like any other (every
chunk a miss). Example::

    wire = ClusterWire(lazy_cluster, link, reader, timeout_s=1.0)
    wire.lanes([key_a, key_b])                      # e.g. [("10.0.0.1", 6379), ...]
    wire.get_many_into([(key_a, slot_a), (key_b, slot_b)])
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Hashable, Sequence
from typing import Any

import redis

from miniflex.remote.link import Link
from miniflex.remote.wire import Endpoint
from miniflex.remote.wire_fetch import ChunkReader, Done, Items, WireFetcher
from miniflex.types import ChunkKey

__all__ = ["ClusterWire"]

Node = tuple[str, int]
_UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError)


class ClusterWire:
    """Windowed fetches from a cluster's primaries, routed by slot; thread safe."""

    def __init__(self, cluster: Any, link: Link, reader: ChunkReader, timeout_s: float) -> None:
        """``cluster``: a :class:`~miniflex.remote.redis_clients.LazyCluster`."""
        self._cluster, self._link, self._timeout_s = cluster, link, timeout_s
        self._reader = dataclasses.replace(reader, moved=self._moved)
        self._fetchers: dict[Node, WireFetcher] = {}
        self._lock = threading.Lock()
        self._stale = threading.Event()
        self._closed = False

    def lanes(self, keys: Sequence[ChunkKey]) -> list[Hashable] | None:
        """The primary of each key, or None if the cluster cannot be reached now."""
        nodes = self._route([self._reader.name_of(k) for k in keys])
        return None if nodes is None else list(nodes)

    def get_many_into(self, items: Items, done: Done | None = None) -> list[int | None]:
        """Each item's value into its byte view, from its primary: its length, or None.

        Items of one primary are fetched in one windowed batch, primaries one after
        another; ``done`` is then called for every item, in order."""
        results: list[int | None] = [None] * len(items)
        nodes = self._route([self._reader.name_of(key) for key, _ in items]) if items else []
        if nodes is None:
            self._link.count(gets=len(items), fast_fails=len(items))
        else:
            groups: dict[Node, list[int]] = {}
            for i, node in enumerate(nodes):
                groups.setdefault(node, []).append(i)
            for node, at in groups.items():
                got = self._fetcher(node).get_many_into([items[i] for i in at])
                for i, n in zip(at, got, strict=True):
                    results[i] = n
        if done is not None:
            for i, n in enumerate(results):
                done(i, n)
        return results

    def close(self) -> None:
        """Close every primary's idle connections; idempotent."""
        with self._lock:
            self._closed = True
            fetchers, self._fetchers = list(self._fetchers.values()), {}
        for f in fetchers:
            f.close()

    def _route(self, names: Sequence[str]) -> list[Node] | None:
        """The primary of each Redis key (the slot map learned again first if stale)."""
        if not self._link.allow():
            return None
        try:
            client = self._cluster.built()
            if self._stale.is_set():
                self._stale.clear()
                client.nodes_manager.initialize()
            manager = client.nodes_manager
            nodes = [manager.get_node_from_slot(client.keyslot(n)) for n in names]
        except _UNREACHABLE as exc:
            self._link.failed(exc, timeout=isinstance(exc, redis.TimeoutError))
            return None
        except redis.RedisError as exc:  # no node for a slot (cluster down), refused...
            self._link.refused(exc, "route")
            self._stale.set()
            return None
        return [(n.host, int(n.port)) for n in nodes]

    def _fetcher(self, node: Node) -> WireFetcher:
        with self._lock:
            fetcher = self._fetchers.get(node)
            if fetcher is None:
                endpoint = self._endpoint(node)
                fetcher = WireFetcher(endpoint, self._link, self._reader, self._timeout_s)
                if self._closed:
                    fetcher.close()
                else:
                    self._fetchers[node] = fetcher
            return fetcher

    def _endpoint(self, node: Node) -> Endpoint:
        """Where ``node`` listens, with the cluster client's credentials."""
        kwargs = self._cluster.built().nodes_manager.connection_kwargs
        host, port = node
        return Endpoint(
            host=host,
            port=port,
            username=kwargs.get("username"),
            password=kwargs.get("password"),
        )

    def _moved(self) -> None:
        self._stale.set()
