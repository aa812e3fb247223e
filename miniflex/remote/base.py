"""The interface of a shared remote store, and the counters every backend keeps.

A :class:`RemoteStore` holds chunk bytes for every replica of one model, below
the local CPU and SSD tiers. One instance serves one namespace (the digest of
model, dtype, layout, geometry and TP shard; see :mod:`miniflex.keys`) and is
owned by one process: each worker for its TP rank's bytes, the scheduler for
lookups. It is thread safe.

The contract every backend keeps:

- **Nothing raises at run time.** ``put``, ``get``, ``exists`` and ``delete``
  turn every failure (store down, timeout, an error reply) into a counted
  failure and a neutral answer (``False``, ``None``, all-``False``): the local
  tiers and recompute carry on. Only :meth:`RemoteStore.check`, called at
  start-up, raises, for settings the store refuses.
- **Bounded time.** No call waits longer than ``remote_timeout_s`` per socket
  operation, and none is retried in place. After a connection failure or
  timeout, calls fail at once for ``remote_retry_s``; then one call tries to
  reconnect, and success resumes normal service by itself.
- **Never a wrong byte.** A value carries a header (MiniFlex's format version,
  the namespace digest, the chunk key, the length and a CRC32 of the bytes).
  ``get`` verifies all of it; a mismatch is counted in ``corrupt``, the value
  is deleted, and the call is a miss.
- **Namespaces never mix.** Keys are ``<prefix>:<namespace digest>:<chunk key>``,
  so one namespace cannot even name another's values.

Example::

    store = open_remote_store(cfg, ns.digest)   # None when remote_url is empty
    store.check()                               # RemoteError for bad credentials
    store.put(key, pool.slot(3))
    data = store.get(key)                       # bytes, or None: load it elsewhere
    n = store.get_into(key, pool.slot(4))       # or straight into a CPU slot
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from types import TracebackType

from miniflex.types import ChunkKey

__all__ = ["RemoteStats", "RemoteStore"]


@dataclass(frozen=True)
class RemoteStats:
    """Cumulative counters of one :class:`RemoteStore` (a snapshot)."""

    puts: int = 0
    """Values written and acknowledged by the store."""
    put_bytes: int = 0
    put_failures: int = 0
    """Puts that failed for any reason (also counted in ``errors`` or ``fast_fails``)."""
    gets: int = 0
    """Calls of ``get``, whatever their outcome."""
    hits: int = 0
    hit_bytes: int = 0
    misses: int = 0
    """Keys the store did not hold."""
    corrupt: int = 0
    """Values that failed verification; each was deleted and answered as a miss."""
    lookups: int = 0
    """Keys asked about by ``exists``."""
    errors: int = 0
    """Calls that reached the store and failed: refused connection, error reply."""
    timeouts: int = 0
    """Calls that ran into ``remote_timeout_s`` (also counted in ``errors``)."""
    fast_fails: int = 0
    """Calls refused without contacting the store, while it was marked down."""
    reconnects: int = 0
    """Times the store answered again after being marked down."""
    down: bool = False
    """True while the store is marked down (calls fail fast)."""


class RemoteStore(abc.ABC):
    """Chunk bytes in a shared store, scoped to one namespace; see the module docstring."""

    url: str
    """Where the store is, for messages (never holds credentials)."""

    @abc.abstractmethod
    def check(self) -> bool:
        """Connect, authenticate, and write, read and delete a probe value.

        Called once at start-up, before serving. Returns ``True`` if the store
        works, ``False`` (after a warning) if it cannot be reached now: the
        local tiers serve meanwhile and later calls reconnect by themselves.
        Raises :class:`~miniflex.errors.RemoteError`, with one line naming the
        config keys to fix, when the store refuses MiniFlex: wrong credentials,
        a user without the permissions it needs, a TLS certificate that does
        not verify, a read-only replica, a store that refuses writes.
        """

    @abc.abstractmethod
    def put(self, key: ChunkKey, data: bytes | bytearray | memoryview) -> bool:
        """Store ``data`` (any C-contiguous buffer) under ``key``, replacing any value.

        ``True`` once the store has acknowledged the whole value, atomically: a
        concurrent ``get`` sees the old value, the new one or none, never a mix.
        ``False`` on any failure (counted); the store then holds the old value
        or none. The caller keeps ``data`` unchanged until this returns.
        """

    @abc.abstractmethod
    def get(self, key: ChunkKey) -> bytes | None:
        """The verified bytes stored under ``key``, or ``None``.

        ``None`` means "load it from elsewhere or recompute": the key is
        absent, the store is down or slow (counted in ``errors``, ``timeouts``
        or ``fast_fails``), or the value failed verification (counted in
        ``corrupt`` and deleted).
        """

    @abc.abstractmethod
    def get_into(self, key: ChunkKey, buf: bytearray | memoryview) -> int | None:
        """Read ``key``'s verified bytes into the start of ``buf``; their length, or ``None``.

        What the tier calls to fetch a hit into a CPU slot (``buf`` is the
        slot): no intermediate copy of the whole value. ``None`` as for
        :meth:`get`; a value longer than ``buf`` is corrupt too (one namespace
        has one chunk size). After ``None``, ``buf``'s bytes are unspecified.
        """

    def get_many_into(
        self,
        items: Sequence[tuple[ChunkKey, memoryview]],
        done: Callable[[int, int | None], None] | None = None,
    ) -> list[int | None]:
        """:meth:`get_into` of each ``(key, buf)``, in order: each result as ``get_into``'s.

        What a load's fetches call, from one thread per stream. A backend may keep
        several requests in flight (pipelined) and fill the buffers as replies
        arrive. ``done(i, result)``, if given, is called once per item, in order,
        as soon as that item's result is known, so that its copy onward can start
        while later items are still arriving. The base class calls ``get_into``
        one item after another.
        """
        out: list[int | None] = []
        for i, (key, buf) in enumerate(items):
            out.append(self.get_into(key, buf))
            if done is not None:
                done(i, out[-1])
        return out

    def lanes(self, keys: Sequence[ChunkKey]) -> list[Hashable] | None:
        """The server that holds each key, where the store spreads keys over several that
        send in parallel (a cluster's primaries); None: one server, or not known now.

        A load's fetcher gives each server its own stream, so that they all send at
        once. A hint: a wrong answer costs speed, never a wrong byte."""
        return None

    @abc.abstractmethod
    def exists(self, keys: Sequence[ChunkKey]) -> list[bool]:
        """Whether the store holds each of ``keys``, in one round trip.

        A hint, not a promise: the value may be evicted or found corrupt
        before a ``get``. All ``False`` when the store cannot answer (counted).
        """

    @abc.abstractmethod
    def delete(self, key: ChunkKey) -> bool:
        """Remove ``key``'s value; ``True`` if the store held it. ``False`` on failure too."""

    @abc.abstractmethod
    def stats(self) -> RemoteStats:
        """A snapshot of the counters."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connections; idempotent. Calls after it fail (counted), never raise."""

    def __enter__(self) -> RemoteStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
