"""StepLoads: in-step loads issued on vLLM's thread, waited for per layer, reported once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from miniflex.gpu.cpu_mover import TorchMover
from miniflex.gpu.synthetic import synthetic_caches
from miniflex.layout import KVGeometry, layout_from_tensors
from miniflex.plan import ChunkMove, JobId, JobKind, LoadTiming, SlotCopy, TransferJob
from miniflex.pool import HostPool
from miniflex.types import BlockId, ChunkKey, ReqId, SlotId
from miniflex.worker.step_loads import StepLoads

BPC = 2
LAYERS = 2


@pytest.fixture
def rank() -> Iterator[tuple[dict[str, torch.Tensor], TorchMover, StepLoads]]:
    """vLLM's KV tensors, a mover over a 4-slot pool whose slot 1 holds blocks 0-1's bytes,
    and the step's loads."""
    g = KVGeometry(LAYERS, 2, 16, 4, "bfloat16", BPC, 2)
    kv = synthetic_caches(g, "LBHNC", 16, "cpu")
    pool = HostPool(4, layout_from_tensors(kv, BPC).geometry.slot_bytes)
    mover = TorchMover(layout_from_tensors(kv, BPC), kv, pool)
    mover.store((ChunkMove(SlotId(1), (BlockId(0), BlockId(1))),))
    yield kv, mover, StepLoads({name: i for i, name in enumerate(kv)})
    pool.close()


def load(i: int, to_blocks: tuple[int, ...], timing: LoadTiming, **kw: object) -> TransferJob:
    chunk = ChunkMove(SlotId(1), tuple(BlockId(b) for b in to_blocks))
    return TransferJob(JobId(i), ReqId(f"r{i}"), JobKind.LOAD, (chunk,), timing=timing, **kw)  # type: ignore[arg-type]


def blocks(kv: dict[str, torch.Tensor], ids: tuple[int, ...]) -> list[torch.Tensor]:
    """The blocks' bytes in every layer (compared as integers: random bits include NaNs)."""
    return [t[list(ids)].view(torch.int16).clone() for t in kv.values()]


@pytest.mark.parametrize("timing", [LoadTiming.LAYERWISE, LoadTiming.SYNC])
def test_a_load_waited_for_layer_by_layer_lands_and_is_reported_ok(rank, timing) -> None:
    kv, mover, steps = rank
    want = blocks(kv, (0, 1))
    steps.issue([load(1, (6, 7), timing)], mover, before_forward=True)
    assert steps
    for name in kv:  # the forward's attention layers, in order
        steps.wait_layer(name)
    (res,) = steps.finish()
    assert res.ok and not res.failed_block_ids and res.num_bytes > 0
    assert all(torch.equal(a, b) for a, b in zip(blocks(kv, (6, 7)), want, strict=True))
    assert not steps and steps.failed == set()


def test_loads_issued_after_the_forward_fail_without_touching_the_blocks(rank) -> None:
    kv, mover, steps = rank
    before = blocks(kv, (6, 7))
    job = load(1, (6, 7), LoadTiming.LAYERWISE, unavailable=(BlockId(8),))
    steps.issue([job], mover, before_forward=False)
    (res,) = steps.finish()
    assert not res.ok and res.failed_block_ids == (6, 7, 8)
    assert all(torch.equal(a, b) for a, b in zip(blocks(kv, (6, 7)), before, strict=True))
    assert steps.failed == {ReqId("r1")}


def test_a_promotion_without_in_step_reads_fails_only_its_own_job(rank) -> None:
    _, mover, steps = rank
    promoted = load(1, (4, 5), LoadTiming.LAYERWISE, promotions=(SlotCopy(ChunkKey(9), 1, 0),))
    plain = load(2, (6, 7), LoadTiming.LAYERWISE)
    steps.issue([promoted, plain], mover, before_forward=True)
    steps.wait_all()  # a full CUDA graph: every layer waited for before the forward
    by_job = {r.job_id: r for r in steps.finish()}
    assert not by_job[JobId(1)].ok and by_job[JobId(1)].failed_block_ids == (4, 5)
    assert by_job[JobId(2)].ok and not by_job[JobId(2)].failed_block_ids
    assert steps.failed == {ReqId("r1")}


def test_a_load_the_mover_cannot_queue_is_failed_and_the_others_go_on(rank) -> None:
    kv, mover, steps = rank
    real = mover.load_layerwise

    def refuses_block_4(chunks, after=None, gate=None):  # type: ignore[no-untyped-def]
        if any(4 in c.block_ids for c in chunks):
            raise RuntimeError("copy could not be queued")
        return real(chunks, after=after, gate=gate)

    mover.load_layerwise = refuses_block_4  # type: ignore[method-assign]
    steps.issue([load(1, (4, 5), LoadTiming.SYNC), load(2, (6, 7), LoadTiming.SYNC)], mover, True)
    steps.wait_layer(next(iter(kv)))  # SYNC: the first attention layer waits for all
    by_job = {r.job_id: r for r in steps.finish()}
    assert not by_job[JobId(1)].ok and by_job[JobId(1)].failed_block_ids == (4, 5)
    assert by_job[JobId(2)].ok


def test_each_step_starts_clean(rank) -> None:
    _, mover, steps = rank
    steps.issue([load(1, (6, 7), LoadTiming.LAYERWISE)], mover, before_forward=False)
    steps.finish()
    assert steps.failed == {ReqId("r1")}
    steps.issue([], mover, before_forward=True)  # the next step: no loads
    assert steps.finish() == [] and steps.failed == set()
