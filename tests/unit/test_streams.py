"""The staging ring and a streamed load's bookkeeping on a worker, without vLLM or a disk."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from miniflex.plan import ChunkMove, JobId, JobKind, JobResult, SlotCopy, TransferJob
from miniflex.types import BlockId, ChunkKey, ReqId, SlotId
from miniflex.worker.job_runner import QueuedJob
from miniflex.worker.streams import StagingRing, StreamedLoad, Streamer


def test_a_staging_slot_is_held_from_its_claim_until_it_is_freed() -> None:
    ring = StagingRing(first=10, count=4)
    assert 10 in ring and 13 in ring and 9 not in ring and 14 not in ring
    ring.claim([SlotId(10), SlotId(11)])
    assert not ring.idle()
    ring.free([SlotId(10), SlotId(11)])
    assert ring.idle()


def test_a_claim_naming_a_slot_outside_the_ring_holds_none() -> None:
    ring = StagingRing(first=10, count=4)
    with pytest.raises(AssertionError):
        ring.claim([SlotId(10), SlotId(3)])
    assert ring.idle()


def test_two_lanes_waiting_for_one_slot_never_hold_it_together() -> None:
    """The ssd-read and remote-fetch lanes both want slot 10 (every load numbers its
    staging slots from the ring's start) while a copy holds it: freeing it lets exactly
    one of them in; the other gets it only once that one's copy frees it again."""
    ring = StagingRing(first=10, count=4)
    ring.claim([SlotId(10), SlotId(11)])  # a window whose copy is still running
    holders: list[str] = []
    lock = threading.Lock()
    inside = threading.Semaphore(0)

    def lane(name: str, window: list[SlotId]) -> None:
        ring.claim(window)
        with lock:
            holders.append(name)
        inside.release()

    lanes = [
        threading.Thread(target=lane, args=("ssd-read", [SlotId(10), SlotId(11)]), daemon=True),
        threading.Thread(target=lane, args=("remote-fetch", [SlotId(10)]), daemon=True),
    ]
    for t in lanes:
        t.start()
    time.sleep(0.05)
    assert holders == []  # both wait for the copy
    ring.free([SlotId(10), SlotId(11)])
    assert inside.acquire(timeout=2)
    time.sleep(0.05)
    assert len(holders) == 1  # the other still waits: slot 10 is held again
    first = holders[0]
    ring.free([SlotId(10), SlotId(11)] if first == "ssd-read" else [SlotId(10)])
    assert inside.acquire(timeout=2)
    for t in lanes:
        t.join(timeout=2)
    assert sorted(holders) == ["remote-fetch", "ssd-read"] and not ring.idle()


def test_a_window_naming_one_slot_twice_holds_none() -> None:
    ring = StagingRing(first=10, count=4)
    with pytest.raises(AssertionError):
        ring.claim([SlotId(10), SlotId(10)])
    assert ring.idle()


def job(streams: tuple[SlotCopy, ...], moves: tuple[ChunkMove, ...]) -> TransferJob:
    return TransferJob(
        JobId(7), ReqId("r"), JobKind.LOAD, moves, unavailable=(BlockId(99),), streams=streams
    )


def test_a_streamed_load_whose_slots_disagree_with_the_ring_fails_whole() -> None:
    """The scheduler numbered staging slots this worker does not have: nothing is read, the
    job resolves failed with every block (and its unavailable ones) a load error, and the
    load thread is handed nothing."""
    queued: list[QueuedJob] = []
    ring = StagingRing(first=4, count=2)
    streamer = Streamer(SimpleNamespace(backend="test"), ring, queued.append)  # type: ignore[arg-type]
    moves = (ChunkMove(SlotId(0), (BlockId(1), BlockId(2))), ChunkMove(SlotId(9), (BlockId(3),)))
    bad = job((SlotCopy(ChunkKey(5), SlotId(9), SlotId(0)),), moves)
    done: Future[JobResult] = Future()
    streamer.run(QueuedJob(bad, None, done), (set(), 0.0, 0.0))
    res = done.result(timeout=1)
    assert not res.ok and set(res.failed_block_ids) == {1, 2, 3, 99}
    assert queued == [] and ring.idle()


def test_a_streamed_load_resolves_once_after_its_last_part() -> None:
    job_ = job((), ())
    done: Future[JobResult] = Future()
    load = StreamedLoad(job_, done, "io_uring")
    load.expect()
    load.expect()
    load.part(JobResult(JobId(7), ReqId("r"), JobKind.LOAD, True, 100, 0.5))
    load.read(({ChunkKey(3)}, 0.25, 0.125))
    load.close()  # the reader has queued every part; one is still copying
    assert not done.done()
    load.part(JobResult(JobId(7), ReqId("r"), JobKind.LOAD, True, 50, 0.25, (BlockId(4),)))
    res = done.result(timeout=1)
    assert (res.ok, res.num_bytes, res.failed_block_ids, res.failed_keys) == (
        True,
        150,
        (4,),
        (3,),
    )
    assert res.seconds == pytest.approx(1.125) and res.ssd_seconds == pytest.approx(0.25)
    assert res.remote_seconds == pytest.approx(0.125)
