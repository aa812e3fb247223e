"""The ``redis`` client of a store URL: one server's, or a Redis Cluster's, built on first use.

``redis://HOST:PORT`` (and ``rediss``, ``valkey``, ``valkeys``, ``unix``) is one
server. ``redis+cluster://HOST:PORT[,HOST:PORT...]`` (``rediss+cluster`` for
TLS, ``valkey+cluster``, ``valkeys+cluster``) names startup nodes of a Redis or
Valkey Cluster: the client learns the slot map from them and sends each chunk
(one key) to the primary that owns its slot, so a fleet's chunks spread over
the cluster's primaries; it follows ``MOVED`` and ``ASK`` while slots migrate.

Both kinds send large values without copying them (:class:`~miniflex.remote.resp.RespPacker`).
A cluster client contacts its startup nodes when it is built, so it is built on first use
(:class:`LazyCluster`): a cluster that is down at start-up is then a failed call like any
other, and MiniFlex serves from its local tiers until it answers. Example::

    client = open_client("redis+cluster://10.0.0.1:6379,10.0.0.2:6379", tls=False,
                         options={"socket_timeout": 1.0})
    client.ping()   # builds the cluster client; a ConnectionError if no node answers
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.cluster import ClusterNode

from miniflex.config.remote import CLUSTER_SCHEMES, TLS_SCHEMES, cluster_node_texts
from miniflex.remote.resp import RespPacker

__all__ = ["LazyCluster", "cluster_nodes", "open_client"]

DEFAULT_PORT = 6379


class _Packed(redis.Connection):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(command_packer=RespPacker(), **kwargs)


class _PackedSSL(redis.SSLConnection):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(command_packer=RespPacker(), **kwargs)


def cluster_nodes(url: str) -> list[tuple[str, int]]:
    """The ``(host, port)`` startup nodes of a cluster URL (port 6379 where none is given)."""
    nodes = []
    for node in cluster_node_texts(url):
        parts = urlsplit(f"//{node}")
        nodes.append((parts.hostname or "", parts.port or DEFAULT_PORT))
    return nodes


def open_client(url: str, tls: bool, options: dict[str, Any]) -> Any:
    """A ``redis.Redis`` for one server, or a :class:`LazyCluster` for a cluster URL."""
    scheme, rest = url.split("://", 1)
    if scheme in CLUSTER_SCHEMES:
        tls = tls or scheme in TLS_SCHEMES
        nodes = [ClusterNode(host, port) for host, port in cluster_nodes(url)]
        return LazyCluster(nodes, {**options, "connection_class": _PackedSSL if tls else _Packed})
    scheme = {"valkey": "redis", "valkeys": "rediss"}.get(scheme, scheme)
    if tls and scheme == "redis":
        scheme = "rediss"
    pool = redis.ConnectionPool.from_url(
        f"{scheme}://{rest}", command_packer=RespPacker(), **options
    )
    return redis.Redis(connection_pool=pool)


class LazyCluster:
    """A ``redis.RedisCluster`` built on first use; every attribute is the built client's.

    A build that fails raises the ``redis`` error its cause names (AuthenticationError,
    NoPermissionError, else ConnectionError), so callers handle it as they handle a failed
    call to one server; the next call tries again.
    """

    def __init__(self, nodes: Sequence[ClusterNode], options: dict[str, Any]) -> None:
        self._nodes = list(nodes)
        self._options = options
        self._client: redis.RedisCluster | None = None
        self._lock = threading.Lock()

    def built(self) -> redis.RedisCluster:
        with self._lock:
            if self._client is None:
                first, *others = self._nodes
                try:  # a URL makes the client build its nodes' pools with connection_class
                    self._client = redis.RedisCluster(
                        url=f"redis://{first.host}:{first.port}",
                        startup_nodes=others,
                        **self._options,
                    )
                except redis.exceptions.RedisClusterException as exc:
                    raise _as_redis_error(exc) from None
            return self._client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.built(), name)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


def _as_redis_error(exc: Exception) -> redis.RedisError:
    text = str(exc)
    if "AuthenticationError" in text or "invalid username-password" in text:
        return redis.AuthenticationError(text)
    if "NOPERM" in text or "NoPermission" in text:
        return redis.exceptions.NoPermissionError(text)
    return redis.ConnectionError(text)
