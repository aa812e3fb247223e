"""StoreBatch and execute_stores: one mover call per plan's stores, each job reported alone."""

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


@pytest.fixture
def cache() -> Iterator[tuple[KVLayout, dict[str, torch.Tensor], HostPool]]:
    g = KVGeometry(2, 2, 16, 4, "bfloat16", BPC, 2)
    kv = synthetic_caches(g, "LBHNC", 16, "cpu")
    layout = layout_from_tensors(kv, BPC)
    pool = HostPool(4, layout.geometry.slot_bytes)
    yield layout, kv, pool
    pool.close()


def store(job_id: int, slot: int, first_block: int) -> QueuedJob:
    chunk = ChunkMove(SlotId(slot), tuple(BlockId(first_block + i) for i in range(BPC)))
    job = TransferJob(JobId(job_id), ReqId(f"r{job_id}"), JobKind.STORE, (chunk,))
    return QueuedJob(job, None, Future())


def test_a_submits_stores_are_one_batch_and_a_late_one_goes_alone() -> None:
    batches: list[tuple[QueuedJob, ...]] = []
    batch = StoreBatch(batches.append)
    a, b, late = store(1, 0, 0), store(2, 1, 2), store(3, 2, 4)
    batch.add(a)
    batch.add(b)
    assert batches == []  # nothing queued before close
    batch.close()
    assert batches == [(a, b)]
    worker = threading.Thread(target=batch.add, args=(late,))  # a slot's reader finished
    worker.start()
    worker.join()
    assert batches == [(a, b), (late,)]
    StoreBatch(batches.append).close()  # an empty submit queues nothing
    assert len(batches) == 2


def test_one_mover_call_copies_every_job_and_each_is_reported_with_its_share(cache) -> None:
    layout, kv, pool = cache
    mover = TorchMover(layout, kv, pool)
    items = [store(1, 0, 0), store(2, 3, 6)]
    calls: list[int] = []
    real = mover.store
    mover.store = lambda chunks, after=None: calls.append(len(chunks)) or real(chunks, after)  # type: ignore[method-assign]
    results = execute_stores(items, mover)
    assert calls == [2]  # one call for both jobs
    page = layout.geometry.page_bytes
    for (item, res), slot, block in zip(results, (0, 3), (0, 6), strict=True):
        assert res.ok and res.job_id == item.job.job_id and res.kind is JobKind.STORE
        assert res.num_bytes == layout.geometry.chunk_bytes
        first = next(iter(kv.values()))  # layer 0's pages land first in the slot
        want = first[block].contiguous().view(torch.uint8).numpy().reshape(-1)[:page]
        assert np.array_equal(np.asarray(pool.slot(SlotId(slot)))[:page], want)


def test_a_failed_copy_fails_every_job_of_the_batch(cache) -> None:
    layout, kv, pool = cache
    mover = TorchMover(layout, kv, pool)

    def broken(chunks: object, after: object = None) -> int:
        raise RuntimeError("device lost")

    mover.store = broken  # type: ignore[method-assign]
    results = execute_stores([store(1, 0, 0), store(2, 1, 2)], mover)
    assert [r.ok for _it, r in results] == [False, False]
    assert execute_stores([store(3, 0, 0)], mover, writes=False)[0][1].ok  # copies nothing
