"""A real Redis killed, hung or absent: every call fails within its timeout, nothing raises,
and the store serves again by itself once the server is back."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from miniflex.remote.base import RemoteStats
from miniflex.remote.local_server import LocalServer
from tests.remote.conftest import CHUNK_BYTES, NEEDS_SERVER, key, payload, store

if TYPE_CHECKING:
    from miniflex.remote.redis_store import RedisStore

pytest.importorskip("redis", reason="the redis client is missing: pip install -e '.[remote]'")
pytestmark = NEEDS_SERVER

TIMEOUT_S = 0.5
RETRY_S = 0.3
SLACK_S = 0.5
"""Scheduling slack on a shared machine; the bound under test is ``TIMEOUT_S``."""


def _timed(call: Callable[[], object]) -> tuple[object, float]:
    t0 = time.monotonic()
    out = call()
    return out, time.monotonic() - t0


def _every_call_fails(s: RedisStore) -> list[float]:
    """Each kind of call once: each returns its neutral answer; their durations."""
    data = payload(CHUNK_BYTES)
    calls: list[tuple[Callable[[], object], object]] = [
        (lambda: s.put(key(9), data), False),
        (lambda: s.get(key(1)), None),
        (lambda: s.exists([key(1), key(2)]), [False, False]),
        (lambda: s.delete(key(1)), False),
    ]
    took = []
    for call, neutral in calls:
        out, seconds = _timed(call)
        assert out == neutral
        took.append(seconds)
    return took


def _until_served(s: RedisStore, data: bytes) -> float:
    """Seconds until a put and get succeed again, calling as a server would, every 50 ms."""
    t0 = time.monotonic()
    while not (s.put(key(2), data) and s.get(key(2)) == data):
        assert time.monotonic() - t0 < 10 * RETRY_S + 5, "the store never came back"
        time.sleep(0.05)
    return time.monotonic() - t0


def test_a_killed_server_fails_calls_fast_and_a_restart_is_picked_up(
    server: LocalServer,
) -> None:
    data = payload(CHUNK_BYTES, seed=5)
    with store(server.url, timeout_s=TIMEOUT_S, retry_s=RETRY_S) as s:
        assert s.put(key(1), data) and s.get(key(1)) == data
        server.kill()
        took = _every_call_fails(s)
        assert max(took) < TIMEOUT_S + SLACK_S, took
        stats = s.stats()
        assert stats.down and stats.errors >= 1 and stats.fast_fails >= 1
        assert stats.put_failures == 1 and stats.reconnects == 0
        server.start()  # same port, empty (no persistence)
        _until_served(s, data)
        after = s.stats()
        assert not after.down and after.reconnects == 1
        assert s.get(key(1)) is None  # the restarted server lost it: a miss, not an error
        assert s.stats().misses == 1


def test_a_hung_server_costs_one_timeout_then_calls_fail_at_once(server: LocalServer) -> None:
    data = payload(CHUNK_BYTES, seed=6)
    with store(server.url, timeout_s=TIMEOUT_S, retry_s=5.0) as s:
        assert s.put(key(1), data)
        server.pause()
        try:
            out, first = _timed(lambda: s.get(key(1)))
            assert out is None and first < TIMEOUT_S + SLACK_S
            assert s.stats().timeouts == 1
            took = _every_call_fails(s)  # inside the retry window: none contacts the server
            assert s.stats().fast_fails == len(took) and s.stats().timeouts == 1
        finally:
            server.resume()


def test_calls_resume_after_a_hung_server_recovers(server: LocalServer) -> None:
    data = payload(CHUNK_BYTES, seed=7)
    with store(server.url, timeout_s=TIMEOUT_S, retry_s=RETRY_S) as s:
        server.pause()
        try:
            out, took = _timed(lambda: s.put(key(1), data))  # 9.4 MB into a full socket
            assert out is False and took < TIMEOUT_S + SLACK_S
        finally:
            server.resume()
        _until_served(s, data)
        assert s.stats().reconnects == 1 and s.stats().timeouts >= 1


def test_a_server_absent_at_start_up_is_a_warning_not_an_error(server: LocalServer) -> None:
    server.kill()
    data = payload(4096)
    with store(server.url, timeout_s=TIMEOUT_S, retry_s=RETRY_S) as s:
        assert s.check() is False  # warned; the local tiers serve meanwhile
        assert s.get(key(1)) is None
        server.start()
        _until_served(s, data)
        assert s.check() is True


def test_calls_after_close_fail_without_raising(server: LocalServer) -> None:
    s = store(server.url)
    assert s.put(key(1), b"x")
    s.close()
    s.close()
    assert s.get(key(1)) is None and not s.put(key(1), b"y")
    stats: RemoteStats = s.stats()
    assert stats.fast_fails == 2 and stats.errors == 0
