"""A real Mooncake master or holder killed, hung or absent: every call fails within its
timeout, nothing raises, a late read never writes into a slot, and the store serves again
by itself once the process is back; as ``test_faults`` for Redis.

Mooncake's own client waits 30 s for a hung holder or master, so the bounds here are
MiniFlex's (:mod:`miniflex.remote.deadline`), not the library's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from miniflex.remote.local_mooncake import LocalMooncake
from tests.remote.conftest import CHUNK_BYTES, key, payload
from tests.remote.mooncake_support import NEEDS_MOONCAKE, mc_store, mooncake

if TYPE_CHECKING:
    from miniflex.remote.mooncake_store import MooncakeStore

pytestmark = NEEDS_MOONCAKE
__all__ = ["mooncake"]  # the fixture

TIMEOUT_S = 0.5
RETRY_S = 0.3
SLACK_S = 0.5
"""Scheduling slack on a shared machine; the bound under test is ``TIMEOUT_S``."""
LATE_CALL_END_S = 40.0
"""Mooncake's own limit on a hung transfer or RPC (30 s), and slack."""


def _timed(call: Callable[[], object]) -> tuple[object, float]:
    t0 = time.monotonic()
    out = call()
    return out, time.monotonic() - t0


def _every_call_fails(s: MooncakeStore) -> list[float]:
    """Each kind of call once: each returns its neutral answer; their durations."""
    data = payload(CHUNK_BYTES)
    slot = bytearray(CHUNK_BYTES)
    calls: list[tuple[Callable[[], object], object]] = [
        (lambda: s.put(key(9), data), False),
        (lambda: s.get(key(1)), None),
        (lambda: s.get_into(key(1), slot), None),
        (lambda: s.exists([key(1), key(2)]), [False, False]),
        (lambda: s.delete(key(1)), False),
    ]
    took = []
    for call, neutral in calls:
        out, seconds = _timed(call)
        assert out == neutral
        took.append(seconds)
    return took


def _until_served(s: MooncakeStore, data: bytes) -> float:
    """Seconds until a put and get succeed again, calling as a server would, every 50 ms."""
    t0 = time.monotonic()
    while not (s.put(key(2), data) and s.get(key(2)) == data):
        assert time.monotonic() - t0 < 30, "the store never came back"
        time.sleep(0.05)
    return time.monotonic() - t0


def _until_no_late_calls(s: MooncakeStore) -> None:
    t0 = time.monotonic()
    while s.late_calls:
        assert time.monotonic() - t0 < LATE_CALL_END_S, "a late call never ended"
        time.sleep(0.05)


def test_a_killed_master_fails_calls_fast_and_a_restart_is_picked_up(
    mooncake: LocalMooncake,
) -> None:
    data = payload(CHUNK_BYTES, seed=5)
    with mc_store(mooncake.url, timeout_s=TIMEOUT_S, retry_s=RETRY_S) as s:
        assert s.check()  # set up at start-up, as a worker does, not within a call
        assert s.put(key(1), data) and s.get(key(1)) == data
        mooncake.kill_master()
        took = _every_call_fails(s)
        assert max(took) < TIMEOUT_S + SLACK_S, took
        stats = s.stats()
        assert stats.down and stats.errors >= 1 and stats.fast_fails >= 1
        assert stats.put_failures == 1 and stats.reconnects == 0
        mooncake.start_master()  # same ports, empty; the holder mounts its memory again
        _until_served(s, data)
        after = s.stats()
        assert not after.down and after.reconnects >= 1
        assert s.get(key(1)) is None  # the restarted master lost it: a miss, not an error
        assert s.stats().misses >= 1


def test_a_killed_holder_fails_calls_fast_and_a_new_one_is_picked_up(
    mooncake: LocalMooncake,
) -> None:
    data = payload(CHUNK_BYTES, seed=6)
    with mc_store(mooncake.url, timeout_s=TIMEOUT_S, retry_s=RETRY_S) as s:
        assert s.check()  # set up at start-up, as a worker does, not within a call
        assert s.put(key(1), data)
        mooncake.kill_holder()  # the master still lists its memory for client_ttl
        out, took = _timed(lambda: s.get(key(1)))
        assert out is None and took < TIMEOUT_S + SLACK_S
        assert s.stats().down and s.stats().errors >= 1
        took_each = _every_call_fails(s)
        assert max(took_each) < TIMEOUT_S + SLACK_S, took_each
        mooncake.start_holder()
        _until_served(s, data)
        # it was in the dead holder's memory: a miss once the master dropped that memory
        # (client_ttl), a failed transfer (bounded, counted) before
        out, took = _timed(lambda: s.get(key(1)))
        assert out is None and took < TIMEOUT_S + SLACK_S
        _until_served(s, data)
        assert not s.stats().down and s.stats().reconnects >= 1


def test_a_hung_holder_costs_one_timeout_then_calls_fail_at_once(
    mooncake: LocalMooncake,
) -> None:
    data = payload(CHUNK_BYTES, seed=7)
    with mc_store(mooncake.url, timeout_s=TIMEOUT_S, retry_s=5.0) as s:
        assert s.check()  # set up at start-up, as a worker does, not within a call
        assert s.put(key(1), data)
        mooncake.pause_holder()
        try:
            out, first = _timed(lambda: s.get(key(1)))
            assert out is None and first < TIMEOUT_S + SLACK_S
            assert s.stats().timeouts == 1 and s.late_calls == 1
            took = _every_call_fails(s)  # inside the retry window: none contacts the store
            assert s.stats().fast_fails == len(took) and s.stats().timeouts == 1
        finally:
            mooncake.resume_holder()
        _until_no_late_calls(s)


def test_a_read_that_outlives_its_timeout_never_writes_into_the_slot(
    mooncake: LocalMooncake,
) -> None:
    data = payload(CHUNK_BYTES, seed=8)
    slot = np.zeros(CHUNK_BYTES, dtype=np.uint8)
    with mc_store(mooncake.url, timeout_s=TIMEOUT_S, retry_s=RETRY_S) as s:
        assert s.check()  # set up at start-up, as a worker does, not within a call
        assert s.put(key(1), data)
        mooncake.pause_holder()
        try:
            out, took = _timed(lambda: s.get_into(key(1), memoryview(slot)))
            assert out is None and took < TIMEOUT_S + SLACK_S and s.late_calls == 1
            slot[:] = 0x5A  # the slot now holds another chunk
        finally:
            mooncake.resume_holder()  # the late read gets its bytes now
        _until_no_late_calls(s)
        assert (slot == 0x5A).all()  # they went to a private buffer, not into the slot
        _until_served(s, data)
        assert s.get_into(key(1), memoryview(slot)) == CHUNK_BYTES
        assert slot.tobytes() == data


def test_a_hung_master_costs_one_timeout_then_calls_fail_at_once(
    mooncake: LocalMooncake,
) -> None:
    data = payload(CHUNK_BYTES, seed=9)
    with mc_store(mooncake.url, timeout_s=TIMEOUT_S, retry_s=RETRY_S) as s:
        assert s.check()  # set up at start-up, as a worker does, not within a call
        assert s.put(key(1), data)
        mooncake.pause_master()
        try:
            out, first = _timed(lambda: s.exists([key(1)]))
            assert out == [False] and first < TIMEOUT_S + SLACK_S
            assert s.stats().timeouts == 1
            took = _every_call_fails(s)
            assert max(took) < TIMEOUT_S + SLACK_S, took
        finally:
            mooncake.resume_master()
        _until_served(s, data)
        assert s.get(key(1)) == data  # the master kept its values: it only paused
        assert s.stats().reconnects >= 1
        _until_no_late_calls(s)


def test_a_master_absent_at_start_up_is_a_warning_not_an_error(
    mooncake: LocalMooncake,
) -> None:
    mooncake.kill()
    data = payload(4096)
    with mc_store(mooncake.url, timeout_s=TIMEOUT_S, retry_s=RETRY_S) as s:
        out, took = _timed(s.check)
        assert out is False and took < TIMEOUT_S + SLACK_S  # warned; local tiers serve
        assert s.get(key(1)) is None
        mooncake.start()
        _until_served(s, data)
        assert s.check() is True


def test_calls_after_close_fail_without_raising(mooncake: LocalMooncake) -> None:
    s = mc_store(mooncake.url)
    assert s.put(key(1), b"x")
    s.close()
    s.close()
    assert s.get(key(1)) is None and not s.put(key(1), b"y")
    assert s.get_into(key(1), bytearray(8)) is None and s.exists([key(1)]) == [False]
    stats = s.stats()
    assert stats.fast_fails == 4 and stats.errors == 0
