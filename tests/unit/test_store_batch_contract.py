"""StoreBatch and execute_stores beyond the basic scenarios: every item is queued exactly
once however adds race the close, and a batch's bytes are shared by each job's chunks."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future

import numpy as np
import pytest
import torch

from miniflex.gpu.cpu_mover import TorchMover
from miniflex.gpu.synthetic import synthetic_caches
from miniflex.layout import KVGeometry, KVLayout, layout_from_tensors
from miniflex.plan import ChunkMove, JobId, JobKind, TransferJob
from miniflex.pool import HostPool
from miniflex.types import BlockId, ReqId, SlotId
from miniflex.worker.job_runner import QueuedJob
from miniflex.worker.store_batch import StoreBatch, execute_stores

BPC = 2
BLOCKS = 16
Rank = tuple[KVLayout, dict[str, torch.Tensor], HostPool, TorchMover]


@pytest.fixture
def rank() -> Iterator[Rank]:
    g = KVGeometry(2, 2, 16, 4, "bfloat16", BPC, 2)
    kv = synthetic_caches(g, "LBHNC", BLOCKS, "cpu")
    layout = layout_from_tensors(kv, BPC)
    pool = HostPool(6, layout.geometry.slot_bytes)
    yield layout, kv, pool, TorchMover(layout, kv, pool)
    pool.close()


def store(job_id: int, *chunks: tuple[int, int]) -> QueuedJob:
    """A STORE of whole chunks, each ``(slot, first block)``."""
    moves = tuple(
        ChunkMove(SlotId(slot), tuple(BlockId(b + i) for i in range(BPC))) for slot, b in chunks
    )
    job = TransferJob(JobId(job_id), ReqId(f"r{job_id}"), JobKind.STORE, moves)
    return QueuedJob(job, None, Future())


def slot_holds(
    layout: KVLayout, kv: dict[str, torch.Tensor], pool: HostPool, slot: int, block: int
) -> bool:
    """Whether ``slot`` begins with layer 0's page of ``block`` (the slot's first page)."""
    page = layout.geometry.page_bytes
    first = next(iter(kv.values()))
    want = first[block].contiguous().view(torch.uint8).numpy().reshape(-1)[:page]
    return bool(np.array_equal(np.asarray(pool.slot(SlotId(slot)))[:page], want))


def test_every_store_added_after_the_close_is_queued_on_its_own() -> None:
    batches: list[tuple[QueuedJob, ...]] = []
    batch = StoreBatch(batches.append)
    batch.close()
    late1, late2 = store(1, (0, 0)), store(2, (1, 2))
    batch.add(late1)
    batch.add(late2)
    assert batches == [(late1,), (late2,)]


def test_stores_added_while_the_batch_closes_are_each_queued_exactly_once() -> None:
    batches: list[tuple[QueuedJob, ...]] = []
    lock = threading.Lock()

    def put(items: tuple[QueuedJob, ...]) -> None:
        with lock:
            batches.append(items)

    batch = StoreBatch(put)
    items = [store(i, (0, 0)) for i in range(64)]
    go = threading.Barrier(5)

    def add_all(part: list[QueuedJob]) -> None:
        go.wait()
        for it in part:
            batch.add(it)

    adders = [threading.Thread(target=add_all, args=(items[i::4],)) for i in range(4)]
    for t in adders:
        t.start()
    go.wait()
    batch.close()
    for t in adders:
        t.join()
    queued = [it for b in batches for it in b]
    assert len(queued) == len(items) and {id(it) for it in queued} == {id(it) for it in items}
    assert sum(len(b) > 1 for b in batches) <= 1  # the close's batch; late ones go alone


def test_a_batchs_bytes_are_shared_by_each_jobs_number_of_chunks(rank: Rank) -> None:
    layout, kv, pool, mover = rank
    one, three = store(1, (0, 0)), store(2, (1, 2), (2, 4), (3, 6))
    results = execute_stores([one, three], mover)
    assert [it for it, _ in results] == [one, three]  # in order, each with its own report
    chunk = layout.geometry.chunk_bytes
    (_, r1), (_, r3) = results
    assert (r1.job_id, r1.req_id, r1.ok, r1.num_bytes) == (1, "r1", True, chunk)
    assert (r3.job_id, r3.req_id, r3.ok, r3.num_bytes) == (2, "r2", True, 3 * chunk)
    assert r3.seconds == pytest.approx(3 * r1.seconds)
    assert all(slot_holds(layout, kv, pool, s, b) for s, b in ((0, 0), (1, 2), (2, 4), (3, 6)))


def test_a_rank_that_does_not_write_reports_every_store_done_without_copying(rank: Rank) -> None:
    _, _, pool, mover = rank
    results = execute_stores([store(1, (0, 0)), store(2, (1, 2))], mover, writes=False)
    assert [(r.ok, r.num_bytes, r.kind) for _, r in results] == [(True, 0, JobKind.STORE)] * 2
    assert not np.asarray(pool.slot(SlotId(0))).any() and not np.asarray(pool.slot(SlotId(1))).any()


def test_a_batch_the_mover_refuses_fails_each_job_with_no_bytes_and_no_failed_blocks(
    rank: Rank,
) -> None:
    _, _, _, mover = rank
    good, outside = store(1, (0, 0)), store(2, (1, BLOCKS))  # blocks past vLLM's cache
    results = execute_stores([good, outside], mover)
    assert [(it.job.job_id, r.job_id) for it, r in results] == [(1, 1), (2, 2)]
    for _, r in results:
        assert (r.ok, r.num_bytes, r.failed_block_ids, r.kind) == (False, 0, (), JobKind.STORE)


def test_no_stores_copy_nothing(rank: Rank) -> None:
    _, _, pool, mover = rank
    assert execute_stores([], mover) == []
    empty = QueuedJob(TransferJob(JobId(1), ReqId("r"), JobKind.STORE, ()), None, Future())
    ((_, res),) = execute_stores([empty], mover)
    assert res.ok and res.num_bytes == 0
    assert not np.asarray(pool.array).any()
