"""The fetch path against a server that misbehaves: garbage, a reply cut short, a reply that stalls.

A fake server (a thread on a local socket) answers whatever it is asked with a
script of bytes; no Redis is needed. Each fault must cost the chunks of that
fetch a miss, within the timeout, with the link marked down, and never a byte
served that the store did not hold whole and verified.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from miniflex.remote.chunk_reply import header_request
from miniflex.remote.envelope import pack_header, split
from miniflex.remote.link import Link
from miniflex.remote.wire import Endpoint
from miniflex.remote.wire_fetch import ChunkReader, WireFetcher
from miniflex.types import ChunkKey

NS = bytes(range(16))
KEY = ChunkKey(7)
PART = 4096
DATA = bytes(range(256)) * 40  # 10,240 bytes: parts of 4096, 4096, 2048
TIMEOUT_S = 0.5


def _header_replies(data: bytes = DATA) -> bytes:
    """What Redis answers to a chunk's header requests, for a well-formed value of ``data``."""
    parts = split(memoryview(data), PART)
    header = pack_header(NS, KEY, memoryview(data), len(parts))
    out = b"*1\r\n$64\r\n" + header + b"\r\n" + b":%d\r\n" % (len(parts) + 1)
    for p in parts:
        out += b":%d\r\n" % len(p)
    return out


def _parts_reply(data: bytes = DATA) -> bytes:
    parts = split(memoryview(data), PART)
    out = b"*%d\r\n" % len(parts)
    for p in parts:
        out += b"$%d\r\n" % len(p) + bytes(p) + b"\r\n"
    return out


class FakeServer:
    """Accepts connections; on each, waits for a request, sends ``script``, then ``ending``:
    ``close`` the connection, or ``stall`` (keep it open, send nothing more)."""

    def __init__(self, script: bytes, ending: str) -> None:
        self.script, self.ending = script, ending
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self._listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            conn.recv(65536)
            conn.sendall(self.script)
            if self.ending == "close":
                conn.close()
            else:
                self._held.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._listener.close()
        for conn in self._held:
            conn.close()


def _fetcher(port: int) -> tuple[WireFetcher, Link, list[str]]:
    link = Link(f"redis://127.0.0.1:{port}", retry_s=30.0)
    dropped: list[str] = []
    reader = ChunkReader(NS, PART, lambda k: f"mf:{k:x}", lambda name, exc: dropped.append(name))
    return WireFetcher(Endpoint("127.0.0.1", port), link, reader, TIMEOUT_S), link, dropped


SCRIPTS = {  # name: (bytes sent, then close or stall, whether the fetch ends in a timeout)
    "garbage": (b"HTTP/1.1 400 Bad Request\r\n\r\n", "close", False),
    "not RESP at all": (b"\x00\x01\x02" * 3000, "stall", False),  # no line end in 4 KiB
    "cut in the header": (_header_replies()[:30], "close", False),
    "cut mid-payload": (_header_replies() * 2 + _parts_reply()[:6000], "close", False),
    "stalls mid-payload": (_header_replies() * 2 + _parts_reply()[:6000], "stall", True),
    "stalls before replying": (b"", "stall", True),
}


@pytest.fixture(params=list(SCRIPTS), ids=str)
def fault(request: pytest.FixtureRequest) -> Iterator[tuple[str, FakeServer]]:
    script, ending, _ = SCRIPTS[request.param]
    srv = FakeServer(script, ending)
    yield request.param, srv
    srv.close()


def test_a_broken_reply_is_a_miss_within_the_timeout(fault: tuple[str, FakeServer]) -> None:
    name, srv = fault
    fetcher, link, dropped = _fetcher(srv.port)
    slots = np.zeros((2, len(DATA)), dtype=np.uint8)
    order: list[tuple[int, int | None]] = []
    t0 = time.monotonic()
    got = fetcher.get_many_into(
        [(KEY, memoryview(slots[0])), (KEY, memoryview(slots[1]))],
        done=lambda i, n: order.append((i, n)),
    )
    elapsed = time.monotonic() - t0
    assert got == [None, None], name
    assert order == [(0, None), (1, None)]  # every item reported once, in order
    assert elapsed < 2 * TIMEOUT_S + 0.5, f"{name}: {elapsed:.2f} s"
    stats = link.stats()
    assert stats.down and stats.errors == 1, (name, stats)
    assert stats.timeouts == int(SCRIPTS[name][2]), (name, stats)
    assert dropped == []  # the store's value was never judged: it is not deleted
    # while the link is down, the next fetch fails at once, without contacting the server
    t0 = time.monotonic()
    assert fetcher.get_many_into([(KEY, memoryview(slots[0]))]) == [None]
    assert time.monotonic() - t0 < 0.05 and link.stats().fast_fails == 1
    fetcher.close()


def test_the_fake_server_scripts_are_what_a_good_server_sends() -> None:
    """The scripts above are cut from a well-formed reply: whole, it is served byte for byte."""
    srv = FakeServer(_header_replies() + _parts_reply(), "stall")
    fetcher, link, _ = _fetcher(srv.port)
    slot = np.zeros(len(DATA), dtype=np.uint8)
    try:
        assert fetcher.get_many_into([(KEY, memoryview(slot))]) == [len(DATA)]
        assert slot.tobytes() == DATA and not link.stats().down
    finally:
        fetcher.close()
        srv.close()
    assert len(header_request("mf:7", len(DATA), PART)) == 2 + 3  # header, HLEN, 3 HSTRLEN


def test_a_value_changed_between_header_and_parts_is_dropped_and_the_link_stays_up() -> None:
    """The parts' sizes differ from what the header requests promised (another client rewrote
    the value in between): the frames do not match, the value is dropped, the connection is
    closed (out of step), and the store is not marked down."""
    resized = DATA[:4000], DATA[4000:8192], DATA[8192:]  # same total, other part sizes
    reply = b"*3\r\n" + b"".join(b"$%d\r\n" % len(p) + p + b"\r\n" for p in resized)
    srv = FakeServer(_header_replies() + reply, "stall")
    fetcher, link, dropped = _fetcher(srv.port)
    slot = np.zeros(len(DATA), dtype=np.uint8)
    try:
        assert fetcher.get_many_into([(KEY, memoryview(slot))]) == [None]
        assert dropped == [f"mf:{KEY:x}"] and not link.stats().down
    finally:
        fetcher.close()
        srv.close()
