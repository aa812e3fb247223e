"""The write-through uploader against a real server: copies handed over on its copy thread,
copy buffers reused once put and bounded by ``max_bytes``, what was handed over put on close."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("redis")

from miniflex.plan import JobId, JobKind, JobResult, RemoteCopy, TransferJob
from miniflex.pool import HostPool
from miniflex.remote.fetch_gate import FetchGate
from miniflex.remote.local_server import LocalServer
from miniflex.remote.tier import WorkerRemote
from miniflex.remote.uploader import RemoteUploader
from miniflex.types import ReqId, SlotId
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
    assert sorted(calls) == [f"copied {i}" for i in range(8)]
    assert up.stats().put == 8 and up.store.get(key(7)) == chunk(7).tobytes()
    up.offer_later([(key(99), chunk(99))], lambda: calls.append("after close"))
    assert calls[-1] == "after close" and not up.offer(key(98), chunk(98))


def test_puts_wait_while_a_fetch_of_the_same_rank_is_in_flight(server: LocalServer) -> None:
    """Loads before puts: chunks offered while a fetch runs are put once it has ended."""
    gate = FetchGate()
    up = RemoteUploader(store(server.url), max_bytes=8 * CHUNK, gate=gate)
    with gate.fetching():
        assert up.offer(key(1), chunk(1)) and up.offer(key(2), chunk(2))
        assert not up.flush(0.5)  # held back behind the fetch
        assert up.stats().put == 0 and up.store.get(key(1)) is None
    assert up.flush(10)
    assert up.stats().put == 2 and up.store.get(key(2)) == chunk(2).tobytes()
    assert gate.take_waited() >= 0.4 and gate.take_waited() == 0.0
    up.close()


def test_close_puts_what_waits_for_a_fetch_that_never_ends(server: LocalServer) -> None:
    """A fetch stuck past shutdown holds no put back: close() puts the queue and returns."""
    gate = FetchGate()
    up = RemoteUploader(store(server.url), max_bytes=8 * CHUNK, gate=gate)
    with gate.fetching():
        assert up.offer(key(3), chunk(3))
        up.close()
        assert up.stats().put == 1 and up.store.get(key(3)) == chunk(3).tobytes()


def test_a_ranks_fetch_holds_back_its_own_write_through(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rank's remote side: a put offered while that rank's fetch waits on the store
    goes out once the fetch has ended, and the fetch gets its chunk."""
    remote = WorkerRemote(store(server.url), write_backlog=8 * CHUNK)
    fetcher = remote.bind(HostPool(2, CHUNK))
    assert remote.uploader is not None and remote.store.put(key(5), chunk(5))
    answer = threading.Event()
    real = type(remote.store).get_many_into

    def slow(s: object, items: object, done: object = None) -> object:
        assert answer.wait(10), "the test never let the store answer"
        return real(s, items, done)  # type: ignore[arg-type]

    monkeypatch.setattr(type(remote.store), "get_many_into", slow)
    fetched: list[tuple[set[int], float]] = []
    fetch = threading.Thread(
        target=lambda: fetched.append(fetcher.fetch([RemoteCopy(key(5), SlotId(0))]))
    )
    fetch.start()
    try:
        assert remote.uploader.offer(key(6), chunk(6))
        assert not remote.uploader.flush(0.5) and remote.store.get(key(6)) is None
    finally:
        answer.set()
    fetch.join(10)
    assert fetched and fetched[0][0] == set()
    assert remote.uploader.flush(10) and remote.store.get(key(6)) == chunk(6).tobytes()
    assert fetcher.pool.slot(SlotId(0)).tobytes() == chunk(5).tobytes()
    remote.close()


def test_a_put_that_raises_loses_its_chunk_and_no_other(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One chunk's put raising mid-batch: the others are put and counted, that one failed."""
    up = RemoteUploader(store(server.url), max_bytes=8 * CHUNK)
    real = type(up.store).put

    def flaky(s: object, k: object, data: object) -> bool:
        if k == key(21):
            raise ConnectionError("reset by peer")
        return real(s, k, data)  # type: ignore[arg-type]

    monkeypatch.setattr(type(up.store), "put", flaky)
    with FetchGate().fetching():  # a gate of its own: not this uploader's, nothing waits
        for i in (20, 21, 22):
            assert up.offer(key(i), chunk(i))
    assert up.flush(10)
    out = up.take_outcome()
    assert (out.acked, out.failed, out.dropped) == (2, 1, 0)
    assert up.store.get(key(22)) == chunk(22).tobytes() and up.take_outcome().acked == 0
    up.close()


def test_write_back_puts_never_wait_for_fetches(server: LocalServer) -> None:
    """Write-back puts chunks the CPU tier evicted: a dropped one would be lost, so they go
    out while the rank fetches."""
    remote = WorkerRemote(store(server.url), write_backlog=8 * CHUNK, loads_first=False)
    fetcher = remote.bind(HostPool(2, CHUNK))
    assert remote.uploader is not None
    with fetcher.gate.fetching():
        assert remote.uploader.offer(key(30), chunk(30))
        assert remote.uploader.flush(10)
    remote.close()


def test_the_puts_of_a_failed_store_job_are_counted_failed(server: LocalServer) -> None:
    """A STORE that failed copied nothing into its slots: its puts are not made, and the
    report says so (the slots are given back at once)."""
    remote = WorkerRemote(store(server.url), write_backlog=8 * CHUNK)
    remote.bind(HostPool(2, CHUNK))
    puts = (RemoteCopy(key(40), SlotId(0)), RemoteCopy(key(41), SlotId(1)))
    job = TransferJob(JobId(1), ReqId("r"), JobKind.STORE, (), remote=puts)
    released = threading.Event()
    failed = JobResult(JobId(1), ReqId("r"), JobKind.STORE, False)
    remote.finished(job, failed, [(puts, released.set)])
    assert released.is_set()
    out = remote.take_outcome()
    assert (out.acked, out.failed) == (0, 2) and remote.store.get(key(40)) is None
    remote.close()


def test_hand_offs_are_copied_at_once_on_several_threads(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second hand-off is copied, and its slots let go, while the first one's copy is held
    (a copy into fresh memory waits on page faults: one thread would hold every slot behind
    the slowest copy)."""
    up = RemoteUploader(store(server.url), max_bytes=8 * CHUNK, copy_threads=2)
    held, real = threading.Event(), RemoteUploader._copy

    def slow_first(self: RemoteUploader, k: object, data: object, buf: np.ndarray) -> bool:
        if k == key(1):
            assert held.wait(10), "the test never let the first copy go"
        return real(self, k, data, buf)  # type: ignore[arg-type]

    monkeypatch.setattr(RemoteUploader, "_copy", slow_first)
    first, second = threading.Event(), threading.Event()
    up.offer_later([(key(1), chunk(1))], first.set)
    up.offer_later([(key(2), chunk(2))], second.set)
    try:
        assert second.wait(10), "the second hand-off waited for the first one's copy"
        assert not first.is_set()
    finally:
        held.set()
    assert first.wait(10) and up.flush(10)
    assert up.store.get(key(1)) == chunk(1).tobytes() and up.store.get(key(2)) == chunk(2).tobytes()
    up.close()


def test_when_the_backlog_runs_out_the_later_hand_off_is_dropped(server: LocalServer) -> None:
    """Buffers are taken per hand-off, in the order handed over, whichever thread copies it:
    the store keeps a prompt's head."""
    up = RemoteUploader(store(server.url), max_bytes=3 * CHUNK, copy_threads=4)
    server.pause()  # nothing is put: every buffer stays queued
    try:
        done = [threading.Event() for _ in range(3)]
        for g in range(3):  # three hand-offs of two chunks each
            chunks = [(key(10 * g + i), chunk(10 * g + i)) for i in range(2)]
            up.offer_later(chunks, done[g].set)
        assert all(d.wait(10) for d in done)
        stats = up.stats()
        assert (stats.offered, stats.dropped) == (6, 3)
    finally:
        server.resume()
    assert up.flush(20)
    up.close()
    kept = [k for k in (0, 1, 10, 11, 20, 21) if up.store.get(key(k)) is not None]
    assert kept == [0, 1, 10]


def test_a_chunk_that_cannot_be_copied_fails_alone_and_its_slots_are_let_go(
    server: LocalServer,
) -> None:
    """A hand-off holding a view released before its copy (its buffer cannot be sized):
    that chunk is counted failed, ``copied`` is still called, and the copy thread lives on
    for the next hand-off."""
    up = RemoteUploader(store(server.url), max_bytes=8 * CHUNK, copy_threads=1)
    gone = memoryview(chunk(1))
    gone.release()
    first, second = threading.Event(), threading.Event()
    up.offer_later([(key(1), gone), (key(2), chunk(2))], first.set)
    up.offer_later([(key(3), chunk(3))], second.set)
    assert first.wait(10) and second.wait(10)
    assert up.flush(10)
    stats = up.stats()
    assert (stats.offered, stats.failed, stats.put) == (3, 1, 2)
    assert stats.buffer_bytes <= 2 * CHUNK  # no buffer counted for the failed chunk
    assert up.store.get(key(3)) == chunk(3).tobytes()
    up.close()
