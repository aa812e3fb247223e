"""The write-through uploader against a real server: copies handed over on its copy thread,
copy buffers reused once put and bounded by ``max_bytes``, what was handed over put on close."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("redis")

from miniflex.remote.local_server import LocalServer
from miniflex.remote.uploader import RemoteUploader
from tests.remote.conftest import NEEDS_SERVER, key, payload, store

pytestmark = NEEDS_SERVER

CHUNK = 64 << 10


def chunk(seed: int) -> np.ndarray:
    return np.frombuffer(payload(CHUNK, seed), dtype=np.uint8).copy()


def test_copies_are_made_then_reported_and_the_bytes_put_are_those_handed_over(
    server: LocalServer,
) -> None:
    up = RemoteUploader(store(server.url), max_bytes=8 * CHUNK)
    slots = [chunk(i) for i in range(3)]
    copied = threading.Event()
    up.offer_later([(key(i), memoryview(s)) for i, s in enumerate(slots)], copied.set)
    assert copied.wait(10)
    originals = [s.tobytes() for s in slots]
    for s in slots:
        s[:] = 0  # the caller may overwrite its slots once ``copied`` was called
    assert up.flush(10)
    up.close()
    assert [up.store.get(key(i)) for i in range(3)] == originals
    assert up.stats().put == 3


def test_buffers_are_reused_once_put_and_never_exceed_max_bytes(server: LocalServer) -> None:
    up = RemoteUploader(store(server.url), max_bytes=2 * CHUNK)
    for i in range(6):  # one at a time: each put is done before the next offer
        assert up.offer(key(i), chunk(i))
        assert up.flush(10)
    assert up.stats().buffer_bytes == CHUNK  # one buffer, reused five times
    server.pause()  # puts wait: the queue fills up to max_bytes
    try:
        offered = [up.offer(key(10 + i), chunk(10 + i)) for i in range(4)]
        assert up.stats().buffer_bytes <= 2 * CHUNK
        assert offered.count(False) >= 1 and up.stats().dropped == offered.count(False)
    finally:
        server.resume()
    assert up.flush(20)
    up.close()


def test_close_copies_and_puts_what_was_handed_over_and_reports_later_offers_at_once(
    server: LocalServer,
) -> None:
    up = RemoteUploader(store(server.url), max_bytes=64 * CHUNK)
    calls: list[str] = []
    for i in range(8):
        up.offer_later([(key(i), chunk(i))], lambda i=i: calls.append(f"copied {i}"))
    up.close()
    assert calls == [f"copied {i}" for i in range(8)]
    assert up.stats().put == 8 and up.store.get(key(7)) == chunk(7).tobytes()
    up.offer_later([(key(99), chunk(99))], lambda: calls.append("after close"))
    assert calls[-1] == "after close" and not up.offer(key(98), chunk(98))
