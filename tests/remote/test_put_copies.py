"""A store with write-through puts is reported before its slots are copied for the puts, so
vLLM gets its blocks back at once; a job that overwrites those slots waits for the copies."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch

pytest.importorskip("redis")

from miniflex.config import MiniFlexConfig
from miniflex.plan import ChunkMove, JobId, JobKind, RemoteCopy, TransferJob, TransferPlan
from miniflex.remote import tier
from miniflex.remote.local_server import LocalServer
from miniflex.remote.tier import WorkerRemote
from miniflex.remote.uploader import RemoteUploader
from miniflex.types import BlockId, ChunkKey, ReqId, SlotId
from miniflex.worker.handler import MiniFlexHandler
from tests.handler_steps import run_plan, wait_until
from tests.remote.conftest import NEEDS_SERVER, NS_A, payload, store

pytestmark = NEEDS_SERVER

BLOCKS = 8


@pytest.fixture
def handler(server: LocalServer) -> Iterator[MiniFlexHandler]:
    kv = {f"layer.{i}": torch.randn(BLOCKS, 1, 16, 128).to(torch.float16) for i in range(2)}
    remote = WorkerRemote(store(server.url, NS_A), write_backlog=1 << 30)
    h = MiniFlexHandler(MiniFlexConfig(mover="cpu"), remote)
    h.register(kv, num_slots=4, blocks_per_chunk=1)
    yield h
    h.shutdown()


def move_job(i: int, req: str, kind: JobKind, block: int, slot: int, key: int) -> TransferJob:
    """A STORE of ``block`` into ``slot`` put as ``key`` after it, or a LOAD of ``key`` into
    ``block`` fetched into ``slot`` first (the read thread)."""
    chunk = ChunkMove(SlotId(slot), (BlockId(block),))
    copy = RemoteCopy(ChunkKey(key), SlotId(slot))
    return TransferJob(JobId(i), ReqId(req), kind, (chunk,), remote=(copy,))


def gated_copies(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[bytes]]:
    """Hold every put's copy (the uploader's copy thread) until the event is set; the bytes
    each copy saw are recorded."""
    gate, seen = threading.Event(), []
    real = RemoteUploader._copy

    def held(self: RemoteUploader, key: ChunkKey, data: np.ndarray, buf: np.ndarray) -> bool:
        assert gate.wait(10), "the test never opened the gate"
        seen.append(np.asarray(data).tobytes())
        return real(self, key, data, buf)

    monkeypatch.setattr(RemoteUploader, "_copy", held)
    return gate, seen


def test_a_store_is_reported_before_its_put_copy_and_its_slot_waits_for_it(
    handler: MiniFlexHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = handler
    assert h._pool is not None and h._remote is not None
    for k in (ChunkKey(7), ChunkKey(8)):  # two chunks another engine stored
        assert h._remote.store.put(k, payload(h._pool.slot_bytes, seed=k))
    gate, seen = gated_copies(monkeypatch)
    try:
        run_plan(h, 1, move_job(0, "a", JobKind.STORE, block=0, slot=0, key=1000))
        # reported while its put copy is held: vLLM gets the request's blocks back
        h.release_when_saved(TransferPlan(jobs=(), step=1, release=(ReqId("a"),)))
        wait_until(lambda: ReqId("a") in h.poll()[0], "the store's report")
        slot0 = h._pool.slot(SlotId(0)).copy()
        # a fetch into slot 0 waits for the copy; a fetch into slot 2 does not
        run_plan(
            h,
            2,
            move_job(1, "b", JobKind.LOAD, block=4, slot=0, key=7),
            move_job(2, "c", JobKind.LOAD, block=5, slot=2, key=8),
        )
        wait_until(lambda: h.in_flight(ReqId("c")) == 0, "the fetch into slot 2")
        assert h.in_flight(ReqId("b")) == 1
        assert np.array_equal(h._pool.slot(SlotId(0)), slot0), "slot 0 overwritten early"
    finally:
        gate.set()
    h.drain()
    assert seen[0] == slot0.tobytes(), "the put copied other bytes than the store wrote"
    assert h._pool.slot(SlotId(0)).tobytes() == payload(h._pool.slot_bytes, seed=ChunkKey(7))


def test_puts_reach_the_store_with_the_bytes_of_their_slots(handler: MiniFlexHandler) -> None:
    h = handler
    assert h._pool is not None and h._remote is not None
    run_plan(h, 1, move_job(0, "a", JobKind.STORE, block=3, slot=2, key=1000))
    h.drain()
    assert h._remote.uploader is not None and h._remote.uploader.flush(10)
    got = np.zeros(h._pool.slot_bytes, dtype=np.uint8)
    n = h._remote.store.get_into(ChunkKey(1000), memoryview(got))
    assert n == h._pool.slot_bytes and np.array_equal(got, h._pool.slot(SlotId(2)))


def test_the_next_store_does_not_wait_for_the_previous_stores_put_copies(
    handler: MiniFlexHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt's stores follow one another on the store thread: were each followed there by
    its put copies, the last store (and the prompt's blocks) would wait for all of them."""
    h = handler
    assert h._pool is not None
    gate, seen = gated_copies(monkeypatch)
    try:
        run_plan(h, 1, move_job(0, "a", JobKind.STORE, block=0, slot=0, key=1000))
        run_plan(h, 2, move_job(1, "a", JobKind.STORE, block=1, slot=1, key=1001))
        h.release_when_saved(TransferPlan(jobs=(), step=2, release=(ReqId("a"),)))
        wait_until(lambda: ReqId("a") in h.poll()[0], "both stores, with their copies held")
        assert seen == []
    finally:
        gate.set()
    h.drain()
    slots = [h._pool.slot(SlotId(0)).tobytes(), h._pool.slot(SlotId(1)).tobytes()]
    assert sorted(seen) == sorted(slots)  # each slot's bytes, copied on any copy thread


def test_a_slot_is_free_to_overwrite_once_its_group_of_puts_is_copied(
    handler: MiniFlexHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long prompt's step stores thousands of chunks in one job: a fetch into the slot of
    one copied early must not wait for the copies of the rest of the job."""
    h = handler
    assert h._pool is not None and h._remote is not None
    monkeypatch.setattr(tier, "PUT_GROUP", 1)
    for k in (ChunkKey(7), ChunkKey(8)):  # two chunks another engine stored
        assert h._remote.store.put(k, payload(h._pool.slot_bytes, seed=k))
    let_through = {ChunkKey(1000): threading.Event(), ChunkKey(1001): threading.Event()}
    seen: dict[ChunkKey, bytes] = {}
    real = RemoteUploader._copy

    def one_at_a_time(
        self: RemoteUploader, key: ChunkKey, data: np.ndarray, buf: np.ndarray
    ) -> bool:
        assert let_through[key].wait(timeout=10), "the test never let this copy through"
        seen[key] = np.asarray(data).tobytes()
        return real(self, key, data, buf)

    monkeypatch.setattr(RemoteUploader, "_copy", one_at_a_time)
    chunks = (ChunkMove(SlotId(0), (BlockId(0),)), ChunkMove(SlotId(1), (BlockId(1),)))
    puts = (RemoteCopy(ChunkKey(1000), SlotId(0)), RemoteCopy(ChunkKey(1001), SlotId(1)))
    try:
        run_plan(h, 1, TransferJob(JobId(0), ReqId("a"), JobKind.STORE, chunks, remote=puts))
        h.release_when_saved(TransferPlan(jobs=(), step=1, release=(ReqId("a"),)))
        wait_until(lambda: ReqId("a") in h.poll()[0], "the store's report")
        let_through[ChunkKey(1000)].set()  # slot 0's copy only
        wait_until(lambda: list(seen) == [ChunkKey(1000)], "slot 0's copy")
        slot1 = h._pool.slot(SlotId(1)).tobytes()
        run_plan(
            h,
            2,
            move_job(1, "b", JobKind.LOAD, block=4, slot=0, key=7),
            move_job(2, "c", JobKind.LOAD, block=5, slot=1, key=8),
        )
        wait_until(lambda: h.in_flight(ReqId("b")) == 0, "the fetch into slot 0")
        assert h.in_flight(ReqId("c")) == 1, "slot 1 overwritten before its copy"
    finally:
        for event in let_through.values():
            event.set()
    h.drain()
    assert seen[ChunkKey(1001)] == slot1, "slot 1 was copied for its put after a fetch into it"
    assert h._pool.slot(SlotId(1)).tobytes() == payload(h._pool.slot_bytes, seed=ChunkKey(8))


def test_a_load_that_waited_for_a_put_copy_reports_the_wait_in_its_wall_time(
    handler: MiniFlexHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``wall_seconds`` counts from the plan's arrival: the wait for the slot's copy is in
    it, as ``wait_seconds``, and not in the load's own ``seconds`` (its fetch and copy)."""
    h = handler
    assert h._pool is not None and h._remote is not None
    assert h._remote.store.put(ChunkKey(7), payload(h._pool.slot_bytes, seed=ChunkKey(7)))
    gate, _ = gated_copies(monkeypatch)
    held_s = 0.3
    try:
        run_plan(h, 1, move_job(0, "a", JobKind.STORE, block=0, slot=0, key=1000))
        run_plan(h, 2, move_job(1, "b", JobKind.LOAD, block=4, slot=0, key=7))
        time.sleep(held_s)
    finally:
        gate.set()
    h.drain()
    h.poll()  # collects the finished jobs' results
    results = {r.job_id: r for r in h.take_results()}
    store, load = results[JobId(0)], results[JobId(1)]
    assert store.ok and store.wall_seconds >= store.seconds > 0  # its copy was not waited for
    assert load.ok and load.wall_seconds >= held_s
    assert load.seconds < load.wall_seconds - held_s / 2
    assert held_s <= load.wait_seconds <= load.wall_seconds - load.seconds
