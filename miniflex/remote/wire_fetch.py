"""Fetches of chunks over MiniFlex's own connections: windows of them, each into its slot.

:class:`WireFetcher` serves :meth:`RemoteStore.get_into` and
:meth:`RemoteStore.get_many_into` of a store on one plain TCP or Unix-socket
server. A batch runs on one connection (several batches at once each take
their own, from a pool that keeps them open), a window of chunks at a time
(:mod:`miniflex.remote.chunk_reply`): a window's header requests, then its
parts requests, with two windows' parts in flight so that the server always has
the next thing to send. A window's payload is read in one system call, and its
framing reads and sends rarely wait (:mod:`miniflex.remote.held_io`), so a
batch gives the interpreter lock up about once per window rather than several
times per chunk.

Memory: nothing is buffered on this side beyond a 64 KiB framing buffer per
connection (the payload goes to the caller's slots); the server holds at most
two windows' replies (2 x ``WINDOW_BYTES``) per connection in its output buffer.

Failures follow the store's contract (:mod:`miniflex.remote.base`): a value
that fails verification is dropped and is a miss; an error reply is counted and
the batch goes on; a broken or timed-out connection is closed, marks the link
down, and every chunk not yet read is a miss. Example::

    fetcher = WireFetcher(endpoint, link, reader, timeout_s=1.0)
    got = fetcher.get_many_into([(key, slot_a), (key2, slot_b)], done=hand_to_gpu)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from miniflex.remote.chunk_reply import (
    OutOfStep,
    PartsPlan,
    header_request,
    parts_request,
    read_header_reply,
)
from miniflex.remote.envelope import CorruptValueError, Header
from miniflex.remote.link import Link
from miniflex.remote.wire import Endpoint, ReplyError, WireConnection, WireError, WireTimeout
from miniflex.types import ChunkKey

__all__ = ["WINDOW_BYTES", "ChunkReader", "Done", "Items", "WireFetcher"]

WINDOW_BYTES = 32 << 20
"""Bytes of chunks read per window (at least one chunk, at most ``MAX_WINDOW``)."""
MAX_WINDOW = 32

Done = Callable[[int, "int | None"], None]
"""Called with each item's index and result, in order, as soon as it is known."""
Items = Sequence[tuple[ChunkKey, memoryview]]


@dataclass
class _Window:
    """A window whose headers were read: the chunks asked for, their expected replies, and
    the requests asking for them."""

    asked: list[int] = field(default_factory=list)
    parts: PartsPlan = field(default_factory=PartsPlan)
    words: list[bytes | bytearray | memoryview] = field(default_factory=list)


@dataclass(frozen=True)
class ChunkReader:
    """How one namespace's chunks are named and read (from the store that owns them)."""

    digest: bytes
    part_bytes: int
    name_of: Callable[[ChunkKey], str]
    drop: Callable[[str, CorruptValueError], None]
    """Count a corrupt value, log it and delete it from the store."""
    moved: Callable[[], None] | None = None
    """Told when a cluster's primary answers ``MOVED`` or ``ASK`` (its slot map is stale)."""


class WireFetcher:
    """Windowed, pipelined fetches over a pool of :class:`WireConnection`; thread safe."""

    def __init__(
        self, endpoint: Endpoint, link: Link, reader: ChunkReader, timeout_s: float
    ) -> None:
        self._endpoint, self._link, self._reader = endpoint, link, reader
        self._timeout_s = timeout_s
        self._idle: list[WireConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def get_many_into(self, items: Items, done: Done | None = None) -> list[int | None]:
        """Each item's value into its byte view: its length, or None (a miss, for any reason)."""
        results: list[int | None] = [None] * len(items)
        self._link.count(gets=len(items))
        reported = 0

        def report(upto: int) -> None:
            nonlocal reported
            for i in range(reported, upto):
                if done is not None:
                    done(i, results[i])
            reported = max(reported, upto)

        try:
            conn = self._open() if items else None
            if conn is not None:
                self._run(conn, items, results, report)
        finally:
            report(len(items))
        return results

    def close(self) -> None:
        """Close the idle connections; batches still running close theirs. Idempotent."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _run(
        self,
        conn: WireConnection,
        items: Items,
        results: list[int | None],
        report: Callable[[int], None],
    ) -> None:
        """Fetch ``items`` on ``conn`` window by window; results of a failed rest stay None.

        Two windows' parts are in flight: the requests go out as ``H0 H1 | P0 H2 P1 H3 |
        P2 H4 | P3 H5 ...`` (H: a window's header requests, P: its parts requests), so
        that after reading window k's parts the next thing on the wire is window k+2's
        headers, and the server is sending window k+1's parts meanwhile (also while this
        thread waits to take the interpreter lock back)."""
        width = max(1, min(MAX_WINDOW, WINDOW_BYTES // max(1, len(items[0][1]))))
        starts = list(range(0, len(items), width))
        windows = [items[at : at + width] for at in starts]

        def heads(j: int) -> list[bytes | bytearray | memoryview]:
            return self._headers(conn, windows[j]) if j < len(windows) else []

        try:
            conn.send_all(heads(0) + heads(1))
            ahead = {j: self._plan(conn, windows[j]) for j in (0, 1) if j < len(windows)}
            conn.send_all([w for j in sorted(ahead) for w in ahead[j].words + heads(j + 2)])
            for k, window in enumerate(windows):
                done = self._finish(conn, window, ahead.pop(k), results, starts[k])
                report(starts[k] + done)
                if done < len(window):
                    conn.close()  # out of step with its requests
                    return
                if k + 2 < len(windows):
                    ahead[k + 2] = self._plan(conn, windows[k + 2])
                    conn.send_all(ahead[k + 2].words + heads(k + 4))
        except WireError as exc:
            conn.close()
            self._link.failed(exc, timeout=isinstance(exc, WireTimeout))
            return
        self._link.succeeded()
        self._give(conn)

    def _plan(self, conn: WireConnection, window: Items) -> _Window:
        """Read a window's header replies: what its parts requests and replies will be."""
        reader = self._reader
        headers = [self._header(conn, key, out) for key, out in window]
        plan = _Window()
        for i, header in enumerate(headers):
            if header is None:
                continue
            key, out = window[i]
            plan.asked.append(i)
            plan.parts.add(out, header, reader.part_bytes)
            plan.words += conn.pack(*parts_request(reader.name_of(key), header.parts))
        return plan

    def _finish(
        self, conn: WireConnection, window: Items, plan: _Window, results: list[int | None], at: int
    ) -> int:
        """Read a window's parts and verify each chunk; how many of its items are done
        (fewer than all: the connection is out of step)."""
        reader = self._reader
        plan.parts.read(conn)
        for j, i in enumerate(plan.asked):
            name = reader.name_of(window[i][0])
            try:
                results[at + i] = n = plan.parts.verified(j)
            except OutOfStep as exc:
                reader.drop(name, exc)
                return i
            except CorruptValueError as exc:
                reader.drop(name, exc)
                continue
            self._link.count(hits=1, hit_bytes=n)
        return len(window)

    def _headers(self, conn: WireConnection, items: Items) -> list[bytes | bytearray | memoryview]:
        name_of, part_bytes = self._reader.name_of, self._reader.part_bytes
        return [
            part
            for key, out in items
            for words in header_request(name_of(key), len(out), part_bytes)
            for part in conn.pack(*words)
        ]

    def _header(self, conn: WireConnection, key: ChunkKey, out: memoryview) -> Header | None:
        """One header reply; a miss, a corrupt value or an error reply is None (counted)."""
        reader = self._reader
        try:
            header = read_header_reply(conn, reader.digest, key, len(out), reader.part_bytes)
        except CorruptValueError as exc:
            reader.drop(reader.name_of(key), exc)
            return None
        except ReplyError as exc:
            self._link.refused(exc, "get")
            if reader.moved is not None and str(exc).startswith(("MOVED", "ASK")):
                reader.moved()
            return None
        if header is None:
            self._link.count(misses=1)
        return header

    def _open(self) -> WireConnection | None:
        """An idle connection or a new one; None if the link is down or it cannot connect."""
        with self._lock:
            if self._closed:
                self._link.count(fast_fails=1)
                return None
            if self._idle:
                return self._idle.pop()
        if not self._link.allow():
            return None
        try:
            return WireConnection(self._endpoint, self._timeout_s)
        except WireError as exc:
            self._link.failed(exc, timeout=isinstance(exc, WireTimeout))
        except ReplyError as exc:
            self._link.refused(exc, "login")
        return None

    def _give(self, conn: WireConnection) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(conn)
                return
        conn.close()
