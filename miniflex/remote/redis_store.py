"""The remote store on Redis or Valkey, through the ``redis`` client (extra ``remote``).

One chunk is one Redis hash, ``<prefix>:<namespace hex>:<chunk key hex>``,
with field ``h`` (the 64-byte header, :mod:`miniflex.remote.envelope`) and
fields ``0`` .. ``n-1`` (the payload in parts of ``part_bytes``). A put is
``MULTI; DEL; HSET (all fields); EXEC``, so a reader never sees half a value;
a get is one ``HGETALL``. A hash is one key, so the server's ``allkeys-lru``
eviction and Redis Cluster's slots treat a chunk as one unit.

Fetches (``get_into``, ``get_many_into``) from one plain TCP or Unix-socket
server run on MiniFlex's own connections (:mod:`miniflex.remote.wire_fetch`):
``HMGET`` of the header and the parts, pipelined, read straight into the slot;
from a cluster, the same from each chunk's primary
(:mod:`miniflex.remote.cluster_wire`). TLS fetches through the ``redis``
client, one chunk per call.

The client never retries in place and never waits longer than
``timeout_s`` per socket operation; :class:`~miniflex.remote.link.Link`
turns failures into counted fast failures and reconnects (see
:mod:`miniflex.remote.base` for the contract).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from miniflex.config.remote import tls_on
from miniflex.errors import RemoteError
from miniflex.remote.base import RemoteStats, RemoteStore
from miniflex.remote.cluster_wire import ClusterWire
from miniflex.remote.envelope import (
    CorruptValueError,
    Header,
    pack_header,
    read_header,
    split,
    verify,
)
from miniflex.remote.link import Link
from miniflex.remote.redis_clients import open_client
from miniflex.remote.wire import Endpoint
from miniflex.remote.wire_fetch import ChunkReader, Done, WireFetcher
from miniflex.types import ChunkKey

__all__ = ["ACL_RULES", "PART_BYTES", "RedisStore"]

log = logging.getLogger("miniflex.remote")

PART_BYTES = 2 << 20
"""Largest field of a stored chunk (see :mod:`miniflex.remote.envelope`)."""

READ_BYTES = 4 << 20
"""The client's socket read size (redis-py's ``socket_read_size``; its default is 64 KiB).

Each read of the socket gives the interpreter lock up and takes it back. While vLLM's engine
thread runs Python, taking it back waits up to the switch interval (5 ms), once per read:
beside a thread that never blocks, a chunk read 64 KiB at a time spends most of its time
waiting for the lock, and one read 4 MiB at a time far less; with the interpreter idle the
read size matters little (``python -m bench.remote_bench``, the busy rows)."""

ACL_RULES = "+@hash +@keyspace +@transaction +ping"
"""The commands an ACL user needs besides its key pattern ``~<prefix>:*``."""

_HEADER_FIELD = b"h"
_UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError)
T = TypeVar("T")


class _Failed:
    """The result of a call that failed (already counted)."""


_FAILED = _Failed()


class RedisStore(RemoteStore):
    """A :class:`RemoteStore` on one Redis or Valkey server (or its TLS / Unix-socket forms),
    or on a Redis or Valkey Cluster (:mod:`miniflex.remote.redis_clients`)."""

    def __init__(
        self,
        url: str,
        namespace_digest: bytes,
        *,
        user: str | None = None,
        password: str | None = None,
        prefix: str = "miniflex",
        tls: bool = False,
        tls_ca_file: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        timeout_s: float = 1.0,
        retry_s: float = 1.0,
        part_bytes: int = PART_BYTES,
    ) -> None:
        assert len(namespace_digest) == 16, namespace_digest
        self.url = url
        self._digest = namespace_digest
        self._scope = f"{prefix}:{namespace_digest.hex()}:"
        self._part_bytes = part_bytes
        self._user = user or "default"
        self._has_password = bool(password)
        self._prefix = prefix
        self._link = Link(url, retry_s)
        self._closed = False
        options: dict[str, object] = {
            "username": user,
            "password": password,
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
            "retry": Retry(NoBackoff(), 0),
            "protocol": 2,  # RESP2: any Redis or Valkey, and the proxies in front of them
            "socket_read_size": READ_BYTES,
        }
        if tls:
            options.update(
                ssl_ca_certs=tls_ca_file, ssl_certfile=tls_cert_file, ssl_keyfile=tls_key_file
            )
        self._client = open_client(url, tls, options)
        self._wire = self._wire_fetcher(timeout_s, tls_on(url, tls))

    def _wire_fetcher(self, timeout_s: float, tls: bool) -> WireFetcher | ClusterWire | None:
        """The fetch path on MiniFlex's own connections (None: TLS)."""
        if tls:
            return None
        reader = ChunkReader(self._digest, self._part_bytes, self.redis_key, self._drop_corrupt)
        if not isinstance(self._client, redis.Redis):  # a cluster, built on first use
            return ClusterWire(self._client, self._link, reader, timeout_s)
        pool = self._client.connection_pool
        return WireFetcher(Endpoint.of_pool(pool.connection_kwargs), self._link, reader, timeout_s)

    def lanes(self, keys: Sequence[ChunkKey]) -> list[Hashable] | None:
        if isinstance(self._wire, ClusterWire):
            return self._wire.lanes(keys)
        return None

    def redis_key(self, key: ChunkKey) -> str:
        """The Redis key holding ``key``'s chunk in this namespace."""
        return f"{self._scope}{key:032x}"

    def check(self) -> bool:
        probe = self._scope + "check"
        try:
            self._client.ping()
            with self._client.pipeline(transaction=True) as pipe:
                pipe.hset(probe, mapping={_HEADER_FIELD: b"probe"})
                pipe.hgetall(probe)
                pipe.delete(probe)
                pipe.execute()
        except redis.AuthenticationError as exc:
            raise RemoteError(self._auth_message(exc)) from None
        except redis.exceptions.NoPermissionError as exc:
            raise RemoteError(
                f"remote store {self.url}: user {self._user!r} may not write and read "
                f"{self._scope}* ({exc}): grant it with "
                f"'ACL SETUSER {self._user} ~{self._prefix}:* {ACL_RULES}'"
            ) from None
        except _UNREACHABLE as exc:
            if _is_tls_failure(exc):
                raise RemoteError(
                    f"remote store {self.url}: TLS handshake failed ({exc}): check "
                    "remote_tls_ca_file (the CA that signed the server's certificate) and "
                    "remote_tls_cert_file / remote_tls_key_file"
                ) from None
            self._link.failed(exc, timeout=isinstance(exc, redis.TimeoutError))
            return False
        except redis.RedisError as exc:
            raise RemoteError(
                f"remote store {self.url} refused a probe write ({exc}): MiniFlex needs a "
                "writable primary with an evicting maxmemory-policy such as allkeys-lru"
            ) from None
        self._link.succeeded()
        return True

    def _auth_message(self, exc: BaseException) -> str:
        if not self._has_password:
            return (
                f"remote store {self.url} requires credentials and none are set ({exc}): set "
                "remote_password or remote_password_file, and remote_user for an ACL user"
            )
        return (
            f"remote store {self.url} refused the credentials of user {self._user!r} ({exc}): "
            "check remote_user and remote_password or remote_password_file"
        )

    def put(self, key: ChunkKey, data: bytes | bytearray | memoryview) -> bool:
        view = memoryview(data).cast("B")
        parts = split(view, self._part_bytes)
        fields: dict[bytes, bytes | memoryview] = {
            _HEADER_FIELD: pack_header(self._digest, key, view, len(parts))
        }
        fields.update((str(i).encode(), part) for i, part in enumerate(parts))
        name = self.redis_key(key)

        def write() -> None:
            with self._client.pipeline(transaction=True) as pipe:
                pipe.delete(name)
                pipe.hset(name, mapping=fields)
                pipe.execute()

        if isinstance(self._call("put", write), _Failed):
            self._link.count(put_failures=1)
            return False
        self._link.count(puts=1, put_bytes=len(view))
        return True

    def get(self, key: ChunkKey) -> bytes | None:
        def join(header: Header, parts: list[bytes]) -> bytes:
            verify(header, parts)
            return b"".join(parts)

        return self._read(key, join)

    def get_into(self, key: ChunkKey, buf: bytearray | memoryview) -> int | None:
        out = memoryview(buf).cast("B")
        if self._wire is not None:
            return self.get_many_into([(key, out)])[0]

        def fill(header: Header, parts: list[bytes]) -> int:
            verify(header, parts, out)
            return header.length

        return self._read(key, fill)

    def get_many_into(
        self, items: Sequence[tuple[ChunkKey, memoryview]], done: Done | None = None
    ) -> list[int | None]:
        if self._wire is None:
            return super().get_many_into(items, done)
        views = [(key, memoryview(buf).cast("B")) for key, buf in items]
        return self._wire.get_many_into(views, done)

    def exists(self, keys: Sequence[ChunkKey]) -> list[bool]:
        self._link.count(lookups=len(keys))
        if not keys:
            return []

        def ask() -> list[int]:
            with self._client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.exists(self.redis_key(key))
                return pipe.execute()

        found = self._call("exists", ask)
        if isinstance(found, _Failed):
            return [False] * len(keys)
        return [bool(n) for n in found]

    def delete(self, key: ChunkKey) -> bool:
        gone = self._call("delete", lambda: self._client.delete(self.redis_key(key)))
        return not isinstance(gone, _Failed) and gone > 0

    def stats(self) -> RemoteStats:
        return self._link.stats()

    def close(self) -> None:
        self._closed = True
        if self._wire is not None:
            self._wire.close()
        self._client.close()

    def _call(self, what: str, fn: Callable[[], T]) -> T | _Failed:
        """Run ``fn`` against the store unless the link is down; failures are counted."""
        if self._closed:
            self._link.count(fast_fails=1)
            return _FAILED
        if not self._link.allow():
            return _FAILED
        try:
            out = fn()
        except _UNREACHABLE as exc:
            self._link.failed(exc, timeout=isinstance(exc, redis.TimeoutError))
            return _FAILED
        except redis.RedisError as exc:  # an error reply: the store is up but said no
            self._link.succeeded()
            self._link.refused(exc, what)
            return _FAILED
        self._link.succeeded()
        return out

    def _read(self, key: ChunkKey, take: Callable[[Header, list[bytes]], T]) -> T | None:
        """Fetch ``key``'s fields and hand its verified header and parts to ``take``."""
        self._link.count(gets=1)
        name = self.redis_key(key)
        try:
            fields = self._call("get", lambda: _fetch(self._client, name))
            if isinstance(fields, _Failed):
                return None
            if not fields:
                self._link.count(misses=1)
                return None
            header = read_header(fields.get(_HEADER_FIELD), self._digest, key)
            parts = [fields.get(str(i).encode(), b"") for i in range(len(fields) - 1)]
            out = take(header, parts)
        except CorruptValueError as exc:
            self._drop_corrupt(name, exc)
            return None
        self._link.count(hits=1, hit_bytes=header.length)
        return out

    def _drop_corrupt(self, name: str, exc: CorruptValueError) -> None:
        self._link.count(corrupt=1)
        log.warning("remote store %s: dropping %s: %s", self.url, name, exc)
        self._call("delete", lambda: self._client.delete(name))


def _fetch(client: redis.Redis, name: str) -> dict[bytes, bytes]:
    """All fields of ``name``; CorruptValueError if it holds something other than a hash."""
    try:
        return client.hgetall(name)
    except redis.ResponseError as exc:
        if str(exc).startswith("WRONGTYPE"):
            raise CorruptValueError("not a MiniFlex hash (WRONGTYPE)") from None
        raise


def _is_tls_failure(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError) or "SSL" in str(seen) or "certificate" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
