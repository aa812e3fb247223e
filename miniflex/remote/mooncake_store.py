"""The remote store on Mooncake Store, through its client (extra ``mooncake``).

One chunk is one Mooncake object, ``<prefix>:<namespace hex>:<chunk key hex>``: the 64-byte
header (:mod:`miniflex.remote.envelope`, the payload as one part) followed by the payload.
A put is one ``upsert``, which replaces a value whole; a fetch is one ``batch_get_into`` of
up to :data:`WINDOW_BYTES`. This process lends the store no memory: ``mooncake_master``
places values in the segments of holder processes (``mooncake_client``) that mount it, and
bytes move between them and this process over TCP, or RDMA where the host has a NIC for it
(:mod:`miniflex.config.mooncake_url`).

Mooncake's client calls take no timeout: a hung holder costs a read 30 s, a hung master
any call 30 s, and connecting to an absent master 90 s. So every call runs on a helper
thread and the caller waits at most ``timeout_s`` (:mod:`miniflex.remote.deadline`);
a call that outlives it is counted as a timeout and marks the store down (the contract of
:mod:`miniflex.remote.base`). ``timeout_s`` bounds a whole call (one put, or one window of
at most :data:`WINDOW_BYTES`), not each socket operation as for Redis.

Calls never get the caller's memory: values are read into private staging buffers, then
copied into the CPU slot and verified there; puts are copied into one first. A late call
may still write into its staging buffer, which is reused only once that call has ended;
never into a slot that holds another chunk by then. That copy costs speed against
Mooncake's own ``batch_get_into`` into a registered buffer (docs/design/remote-mooncake.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from miniflex.bytecopy import copy_into
from miniflex.config.mooncake_url import parse_mooncake_url
from miniflex.errors import RemoteError
from miniflex.remote.base import RemoteStats, RemoteStore
from miniflex.remote.deadline import CallTimeout, DeadlineCalls, StagingPool
from miniflex.remote.envelope import (
    HEADER_BYTES,
    CorruptValueError,
    pack_header,
    read_header,
    verify,
)
from miniflex.remote.link import Link
from miniflex.remote.mooncake_client import (
    MISSING,
    NO_ROOM,
    TOO_SMALL,
    MooncakeClient,
    MooncakeCodeError,
)
from miniflex.types import ChunkKey

__all__ = ["MooncakeStore", "WINDOW_BYTES"]

log = logging.getLogger("miniflex.remote")

WINDOW_BYTES = 32 << 20
"""Most bytes one ``batch_get_into`` fetches (at least one chunk); each is given ``timeout_s``."""
SETUP_WAIT_S = 5.0
"""How long :meth:`MooncakeStore.check` (once, at start-up) waits at most for the client's
set-up and probe, if ``timeout_s`` is shorter: set-up registers with the master and the
metadata server over the network."""
MAX_LATE = 4
"""Late calls at most; while this many still run, calls fail without starting another."""
T = TypeVar("T")


class _Failed:
    """The result of a call that failed (already counted)."""


_FAILED = _Failed()
_LATE = _Failed()
"""A call that outlived its deadline: the buffers it was lent are its own until it ends."""


class MooncakeStore(RemoteStore):
    """A :class:`RemoteStore` on a Mooncake Store; see the module docstring."""

    def __init__(
        self,
        url: str,
        namespace_digest: bytes,
        *,
        prefix: str = "miniflex",
        timeout_s: float = 1.0,
        retry_s: float = 1.0,
        **_unused: object,
    ) -> None:
        """``_unused``: the Redis backend's options (credentials, TLS), which the config
        refuses for a ``mooncake://`` URL."""
        assert len(namespace_digest) == 16, namespace_digest
        self.url = url
        self._conn = MooncakeClient(parse_mooncake_url("remote_url", url), timeout_s)
        self._digest = namespace_digest
        self._scope = f"{prefix}:{namespace_digest.hex()}:"
        self._timeout_s = timeout_s
        self._link = Link(url, retry_s)
        self._calls = DeadlineCalls(MAX_LATE, "miniflex-mooncake")
        self._staging = StagingPool()
        self._closed = False

    def store_key(self, key: ChunkKey) -> str:
        """The Mooncake key holding ``key``'s chunk in this namespace."""
        return f"{self._scope}{key:032x}"

    @property
    def staging_bytes(self) -> int:
        """Bytes of the private buffers calls read into and write from (kept for reuse)."""
        return self._staging.allocated

    @property
    def late_calls(self) -> int:
        """Client calls that outlived their deadline and are still running."""
        return self._calls.late

    def check(self) -> bool:
        wait = max(self._timeout_s, SETUP_WAIT_S)
        try:
            self._calls.run(lambda: self._conn.probe(self._scope + "check"), wait)
        except MooncakeCodeError as exc:
            if not exc.unreachable and exc.code != NO_ROOM:
                raise RemoteError(
                    f"remote store {self.url} refused a probe write ({exc}): MiniFlex needs "
                    "a mooncake_master with holders (mooncake_client) mounting memory"
                ) from None
            self._link.failed(exc, timeout=False)
            return False
        except CallTimeout as exc:
            self._link.failed(exc, timeout=True)
            return False
        except Exception as exc:  # refused connection, a failed set-up
            self._link.failed(exc, timeout=False)
            return False
        self._link.succeeded()
        return True

    def put(self, key: ChunkKey, data: bytes | bytearray | memoryview) -> bool:
        view = memoryview(data).cast("B")
        nbytes = HEADER_BYTES + len(view)
        buf = self._staging.take(nbytes)
        copy_into(buf, HEADER_BYTES, view)
        payload = memoryview(buf)[HEADER_BYTES:nbytes]  # the header is of the bytes sent
        header = pack_header(self._digest, key, payload, 1 if len(view) else 0)
        buf[:HEADER_BYTES] = np.frombuffer(header, dtype=np.uint8)
        name = self.store_key(key)

        def upsert(conn: MooncakeClient) -> None:
            client = conn.ready()
            rc = client.upsert_from(name, conn.lend(client, buf), nbytes)
            if rc != 0:
                raise MooncakeCodeError("put", rc)

        out = self._call("put", upsert, lent=[buf])
        if out is not _LATE:
            self._staging.give(buf)
        if isinstance(out, _Failed):
            self._link.count(put_failures=1)
            return False
        self._link.count(puts=1, put_bytes=len(view))
        return True

    def get(self, key: ChunkKey) -> bytes | None:
        self._link.count(gets=1)
        name = self.store_key(key)
        size = self._call("get", lambda conn: conn.size(name))
        if isinstance(size, _Failed):
            return None
        if size < 0:
            self._link.count(misses=1)
            return None
        if size < HEADER_BYTES:
            self._drop_corrupt(name, CorruptValueError("no MiniFlex header"))
            return None
        out = bytearray(size - HEADER_BYTES)
        n = self._fetch_window([(key, memoryview(out))])[0]
        return None if n is None else bytes(out)

    def get_into(self, key: ChunkKey, buf: bytearray | memoryview) -> int | None:
        return self.get_many_into([(key, memoryview(buf).cast("B"))])[0]

    def get_many_into(
        self,
        items: Sequence[tuple[ChunkKey, memoryview]],
        done: Callable[[int, int | None], None] | None = None,
    ) -> list[int | None]:
        self._link.count(gets=len(items))
        out: list[int | None] = []
        for window in _windows([(key, memoryview(buf).cast("B")) for key, buf in items]):
            for result in self._fetch_window(window):
                out.append(result)
                if done is not None:
                    done(len(out) - 1, result)
        return out

    def exists(self, keys: Sequence[ChunkKey]) -> list[bool]:
        self._link.count(lookups=len(keys))
        if not keys:
            return []
        names = [self.store_key(key) for key in keys]
        found = self._call("exists", lambda conn: conn.exist(names))
        return [False] * len(keys) if isinstance(found, _Failed) else found

    def delete(self, key: ChunkKey) -> bool:
        name = self.store_key(key)
        gone = self._call("delete", lambda conn: conn.remove(name))
        return gone is True

    def stats(self) -> RemoteStats:
        return self._link.stats()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._conn.set_up:
            return
        if self._calls.late:  # a late call still uses the client: leave it to the process
            log.warning("remote store %s: closed with %d calls hung", self.url, self._calls.late)
            return
        try:
            idle = self._staging.clear()
            self._calls.run(lambda: self._conn.close(idle), self._timeout_s)
        except Exception as exc:  # counted nowhere: the store is closed
            log.warning("remote store %s: closing the client failed: %s", self.url, exc)

    def _fetch_window(self, window: Sequence[tuple[ChunkKey, memoryview]]) -> list[int | None]:
        """Fetch, verify and copy one window of ``(key, slot)``; each result as ``get_into``'s."""
        sizes = [HEADER_BYTES + len(out) for _, out in window]
        bufs = [self._staging.take(n) for n in sizes]
        names = [self.store_key(key) for key, _ in window]

        def fetch(conn: MooncakeClient) -> list[int]:
            client = conn.ready()
            ptrs = [conn.lend(client, buf) for buf in bufs]
            codes = list(client.batch_get_into(names, ptrs, sizes))
            if len(codes) != len(names):
                raise MooncakeCodeError(f"get of {len(names)} keys answered {len(codes)}", -1)
            return codes

        codes = self._call("get", fetch, lent=bufs)
        if codes is _LATE:
            return [None] * len(window)
        try:
            if isinstance(codes, _Failed):
                return [None] * len(window)
            return [
                self._take(key, name, buf, code, out)
                for (key, out), name, buf, code in zip(window, names, bufs, codes, strict=True)
            ]
        finally:
            for buf in bufs:
                self._staging.give(buf)

    def _take(
        self, key: ChunkKey, name: str, buf: np.ndarray, code: int, out: memoryview
    ) -> int | None:
        """The verified payload that ``code`` bytes of ``buf`` hold, copied into ``out``."""
        if code in MISSING:
            self._link.count(misses=1)
            return None
        try:
            if code == TOO_SMALL:
                raise CorruptValueError(f"longer than the {len(out)}-byte buffer")
            if code < 0:
                self._code_failed(MooncakeCodeError("get", code), "get")
                return None
            if code < HEADER_BYTES:
                raise CorruptValueError("no MiniFlex header")
            header = read_header(buf[:HEADER_BYTES].tobytes(), self._digest, key)
            payload = memoryview(buf)[HEADER_BYTES:code]
            verify(header, [payload] if len(payload) else [], out)
        except CorruptValueError as exc:
            self._drop_corrupt(name, exc)
            return None
        self._link.count(hits=1, hit_bytes=header.length)
        return header.length

    def _drop_corrupt(self, name: str, exc: CorruptValueError) -> None:
        self._link.count(corrupt=1)
        log.warning("remote store %s: dropping %s: %s", self.url, name, exc)
        self._call("delete", lambda conn: conn.remove(name))

    def _call(
        self, what: str, op: Callable[[MooncakeClient], T], lent: Sequence[np.ndarray] = ()
    ) -> T | _Failed:
        """``op(client)`` on a helper thread unless the store is down; failures are counted.

        ``_LATE`` if it outlived ``timeout_s``: the ``lent`` buffers then go back to the
        pool when it ends; otherwise they are still the caller's."""
        if self._closed:
            self._link.count(fast_fails=1)
            return _FAILED
        if not self._link.allow():
            return _FAILED

        def give_back() -> None:
            for buf in lent:
                self._staging.give(buf)

        try:
            out = self._calls.run(lambda: op(self._conn), self._timeout_s, give_back)
        except CallTimeout as exc:
            self._link.failed(exc, timeout=True)
            return _LATE
        except MooncakeCodeError as exc:
            self._code_failed(exc, what)
            return _FAILED
        except Exception as exc:  # TooManyLate, no connection, a client error
            self._link.failed(exc, timeout=False)
            return _FAILED
        self._link.succeeded()
        return out

    def _code_failed(self, exc: MooncakeCodeError, what: str) -> None:
        if exc.unreachable:
            self._link.failed(exc, timeout=False)
        else:  # the store is up but said no
            self._link.succeeded()
            self._link.refused(exc, what)


def _windows(
    items: Sequence[tuple[ChunkKey, memoryview]],
) -> list[list[tuple[ChunkKey, memoryview]]]:
    """``items`` in consecutive groups of at most :data:`WINDOW_BYTES` (one item at least)."""
    out: list[list[tuple[ChunkKey, memoryview]]] = []
    total = WINDOW_BYTES
    for item in items:
        nbytes = HEADER_BYTES + len(item[1])
        if total + nbytes > WINDOW_BYTES:
            out.append([])
            total = 0
        out[-1].append(item)
        total += nbytes
    return out
