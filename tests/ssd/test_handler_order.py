"""The worker's job order with the SSD tier: a store into a slot still being written to SSD
waits for that write, and the jobs queued after it do not."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from miniflex.config import MiniFlexConfig
from miniflex.plan import ChunkMove, JobId, JobKind, SlotCopy, TransferJob
from miniflex.ranks import RankSetup
from miniflex.ssd.copier import SSDCopier
from miniflex.types import BlockId, ChunkKey, ReqId, SlotId
from miniflex.worker.handler import MiniFlexHandler
from tests.handler_steps import run_plan, wait_until

BLOCKS = 8
SLOTS = 4


def job(i: int, req: str | None, kind: JobKind, **kw: object) -> TransferJob:
    return TransferJob(JobId(i), None if req is None else ReqId(req), kind, **kw)  # type: ignore[arg-type]


def gated(monkeypatch: pytest.MonkeyPatch, method: str) -> threading.Event:
    """Hold every call of ``SSDCopier.<method>`` (the disk) until the returned event is set."""
    gate = threading.Event()
    real = getattr(SSDCopier, method)

    def slow(self: SSDCopier, copies: tuple[SlotCopy, ...]) -> object:
        assert gate.wait(10), "the test never opened the gate"
        return real(self, copies)

    monkeypatch.setattr(SSDCopier, method, slow)
    return gate


@pytest.fixture
def handler(direct_dir: Path) -> MiniFlexHandler:
    config = MiniFlexConfig(mover="cpu", ssd_dirs=(str(direct_dir),), ssd_bytes=1 << 20)
    kv = {f"layer.{i}": torch.randn(BLOCKS, 1, 16, 128).to(torch.float16) for i in range(2)}
    h = MiniFlexHandler(config)
    h.register(kv, num_slots=SLOTS, blocks_per_chunk=1, setup=RankSetup(shard_digest=b"\x01" * 16))
    yield h
    h.shutdown()


def slot_bytes(h: MiniFlexHandler, slot: int) -> np.ndarray:
    assert h._pool is not None
    return h._pool.slot(SlotId(slot)).copy()


def test_a_store_waiting_for_its_slots_write_back_does_not_hold_up_later_jobs(
    handler: MiniFlexHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = handler
    # slot 0 <- block 0, slot 1 <- block 1
    store = ChunkMove(SlotId(0), (BlockId(0),)), ChunkMove(SlotId(1), (BlockId(1),))
    run_plan(h, 1, job(0, "a", JobKind.STORE, chunks=store))
    h.drain()
    old_slot0 = slot_bytes(h, 0)

    gate = gated(monkeypatch, "demote")  # the disk: its write of slot 0 ends when told
    demote = job(1, None, JobKind.DEMOTE, chunks=(), demotions=(SlotCopy(ChunkKey(7), 0, 0),))
    overwrite = job(2, "b", JobKind.STORE, chunks=(ChunkMove(SlotId(0), (BlockId(2),)),))
    load = job(3, "c", JobKind.LOAD, chunks=(ChunkMove(SlotId(1), (BlockId(5),)),))
    later_store = job(4, "d", JobKind.STORE, chunks=(ChunkMove(SlotId(2), (BlockId(3),)),))
    run_plan(h, 2, demote, overwrite, load, later_store)

    wait_until(lambda: h.in_flight(ReqId("c")) == 0 and h.in_flight(ReqId("d")) == 0, "jobs")
    assert h.in_flight(ReqId("b")) == 1  # still waiting for the disk
    assert np.array_equal(slot_bytes(h, 0), old_slot0)  # not overwritten before it is written

    gate.set()
    h.drain()
    assert not np.array_equal(slot_bytes(h, 0), old_slot0)  # block 2's bytes now
    h.poll()
    results = {r.job_id: r for r in h.take_results()}
    assert all(results[JobId(i)].ok for i in (1, 2, 3, 4))


def test_a_slow_ssd_read_does_not_hold_up_the_gpu_copies_queued_after_it(
    handler: MiniFlexHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = handler
    key = ChunkKey(11)
    store = ChunkMove(SlotId(0), (BlockId(0),)), ChunkMove(SlotId(1), (BlockId(1),))
    demote = job(1, None, JobKind.DEMOTE, chunks=(), demotions=(SlotCopy(key, 0, 0),))
    run_plan(h, 1, job(0, "a", JobKind.STORE, chunks=store))
    h.drain()  # stored: only a published chunk is ever written back
    run_plan(h, 2, demote)
    h.drain()  # block 0's bytes are on SSD now, as chunk `key`
    on_ssd = slot_bytes(h, 0)

    gate = gated(monkeypatch, "promote")  # the disk: the read of `key` ends when told
    promoted = job(
        2,
        "b",
        JobKind.LOAD,
        chunks=(ChunkMove(SlotId(2), (BlockId(6),)),),
        promotions=(SlotCopy(key, 2, 0),),
    )
    cpu_hit = job(3, "c", JobKind.LOAD, chunks=(ChunkMove(SlotId(1), (BlockId(5),)),))
    run_plan(h, 3, promoted, cpu_hit)

    wait_until(lambda: h.in_flight(ReqId("c")) == 0, "the CPU hit's load")
    assert h.in_flight(ReqId("b")) == 1  # still reading from SSD

    gate.set()
    h.drain()
    assert np.array_equal(slot_bytes(h, 2), on_ssd)  # read back from SSD, byte for byte
    h.poll()
    results = {r.job_id: r for r in h.take_results()}
    assert results[JobId(2)].ok and not results[JobId(2)].failed_keys
    assert results[JobId(3)].ok


def test_an_ssd_read_does_not_queue_behind_a_write_back_of_other_slots(
    handler: MiniFlexHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = handler
    key = ChunkKey(13)
    run_plan(h, 1, job(0, "a", JobKind.STORE, chunks=(ChunkMove(SlotId(0), (BlockId(0),)),)))
    h.drain()
    run_plan(h, 2, job(1, None, JobKind.DEMOTE, chunks=(), demotions=(SlotCopy(key, 0, 0),)))
    h.drain()  # chunk `key` is on SSD

    gate = gated(monkeypatch, "demote")  # the disk is busy writing slot 3 back until told
    other = job(2, None, JobKind.DEMOTE, chunks=(), demotions=(SlotCopy(ChunkKey(14), 3, 1),))
    promoted = job(
        3,
        "b",
        JobKind.LOAD,
        chunks=(ChunkMove(SlotId(2), (BlockId(6),)),),
        promotions=(SlotCopy(key, 2, 0),),
    )
    run_plan(h, 3, other, promoted)
    wait_until(lambda: h.in_flight(ReqId("b")) == 0, "the promotion")
    assert h.in_flight(None) == 1  # the write-back of slot 3 is still going
    gate.set()
    h.drain()
