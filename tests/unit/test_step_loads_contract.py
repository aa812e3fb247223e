"""StepLoads beyond the basic scenarios: which layers each timing orders the forward after,
what a forward that skipped a layer gets, and promotions read from a real SSD store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from miniflex.config import MiniFlexConfig
from miniflex.gpu.cpu_mover import TorchMover
from miniflex.gpu.synthetic import synthetic_caches
from miniflex.layout import KVGeometry, layout_from_tensors
from miniflex.plan import ChunkMove, JobId, JobKind, LoadTiming, SlotCopy, TransferJob
from miniflex.pool import HostPool
from miniflex.ssd.copier import SSDCopier
from miniflex.types import BlockId, ChunkKey, ReqId, SlotId
from miniflex.worker.slot_guard import SlotGuard
from miniflex.worker.step_loads import StepLoads
from miniflex.worker.step_reads import StepReads
from tests.connector.movers import POISON, GatedMover

BPC = 2
GEOMETRY = KVGeometry(2, 2, 64, 16, "bfloat16", 2, BPC)  # one layer of a chunk: 16 KiB
KEY = ChunkKey(0xC0FFEE)
Rank = tuple[dict[str, torch.Tensor], HostPool, GatedMover]


@pytest.fixture
def rank() -> Iterator[Rank]:
    """vLLM's KV tensors, a 4-slot pool whose slot 1 holds blocks 0-1's bytes, and the
    harness's mover over the real one: a layer's bytes land only once it is waited for."""
    kv = synthetic_caches(GEOMETRY, "LBHNC", 16, "cpu")
    layout = layout_from_tensors(kv, BPC)
    pool = HostPool(4, layout.geometry.slot_bytes)
    real = TorchMover(layout, kv, pool)
    real.store((ChunkMove(SlotId(1), (BlockId(0), BlockId(1))),))
    yield kv, pool, GatedMover(real, kv, real)
    pool.close()


def steps_of(kv: dict[str, torch.Tensor], reads: StepReads | None = None) -> StepLoads:
    return StepLoads({name: i for i, name in enumerate(kv)}, reads)


def load(i: int, timing: LoadTiming, blocks: tuple[int, ...] = (6, 7), **kw: object) -> TransferJob:
    chunk = ChunkMove(SlotId(1), tuple(BlockId(b) for b in blocks))
    return TransferJob(JobId(i), ReqId(f"r{i}"), JobKind.LOAD, (chunk,), timing=timing, **kw)  # type: ignore[arg-type]


def layer_blocks(kv: dict[str, torch.Tensor], layer: int, ids: tuple[int, ...]) -> torch.Tensor:
    """One layer's blocks as integers (random bits include NaNs)."""
    return list(kv.values())[layer][list(ids)].view(torch.int16).clone()


def poisoned(kv: dict[str, torch.Tensor], layer: int, ids: tuple[int, ...]) -> bool:
    return bool((list(kv.values())[layer][list(ids)] == POISON).all())


def test_a_layerwise_load_orders_each_layer_after_its_own_copy_only(rank: Rank) -> None:
    kv, _, mover = rank
    want = [layer_blocks(kv, layer, (0, 1)) for layer in range(2)]
    steps = steps_of(kv)
    steps.issue([load(1, LoadTiming.LAYERWISE)], mover, before_forward=True)
    names = list(kv)
    steps.wait_layer(names[0])
    assert torch.equal(layer_blocks(kv, 0, (6, 7)), want[0])
    assert poisoned(kv, 1, (6, 7))  # layer 1 still copies while layer 0 computes
    steps.wait_layer(names[1])
    assert torch.equal(layer_blocks(kv, 1, (6, 7)), want[1])
    (res,) = steps.finish()
    assert res.ok and not res.failed_block_ids


def test_a_sync_load_lands_every_layer_at_the_first_attention_layer(rank: Rank) -> None:
    kv, _, mover = rank
    steps = steps_of(kv)
    steps.issue([load(1, LoadTiming.SYNC)], mover, before_forward=True)
    steps.wait_layer(next(iter(kv)))
    assert mover.log == [("wait", 0), ("wait", 1)]
    assert not poisoned(kv, 1, (6, 7))


def test_an_unknown_layer_name_orders_the_forward_after_every_layer(rank: Rank) -> None:
    kv, _, mover = rank
    steps = steps_of(kv)
    steps.issue([load(1, LoadTiming.LAYERWISE)], mover, before_forward=True)
    steps.wait_layer("model.drafter.attn")  # not a registered KV cache layer
    assert sorted(mover.log) == [("wait", 0), ("wait", 1)]
    for name in kv:
        steps.wait_layer(name)  # already waited: nothing more
    assert len(mover.log) == 2
    (res,) = steps.finish()
    assert res.ok


def test_a_forward_that_skipped_a_layer_reports_the_load_failed(rank: Rank) -> None:
    kv, _, mover = rank
    steps = steps_of(kv)
    job = load(1, LoadTiming.LAYERWISE, unavailable=(BlockId(8),))
    steps.issue([job], mover, before_forward=True)
    steps.wait_layer(next(iter(kv)))  # a backend that never waits for layer 1
    (res,) = steps.finish()
    assert not res.ok and res.failed_block_ids == (6, 7, 8)  # vLLM recomputes them
    assert steps.failed == {ReqId("r1")}


def test_unavailable_blocks_of_a_good_load_are_reported_and_its_request_marked(
    rank: Rank,
) -> None:
    kv, _, mover = rank
    steps = steps_of(kv)
    steps.issue([load(1, LoadTiming.LAYERWISE, unavailable=(BlockId(8),))], mover, True)
    steps.wait_all()
    (res,) = steps.finish()
    assert res.ok and res.failed_block_ids == (8,)
    assert steps.failed == {ReqId("r1")}  # what the step computed past block 8 is suspect


def test_a_step_without_loads_is_empty_and_finishes_with_nothing(rank: Rank) -> None:
    kv, _, mover = rank
    steps = steps_of(kv)
    steps.issue([], mover, before_forward=True)
    assert not steps
    steps.wait_layer(next(iter(kv)))
    assert steps.finish() == [] and mover.log == []


@pytest.fixture
def copier(rank: Rank, direct_dir: Path) -> Iterator[SSDCopier]:
    """An SSD store holding slot 1's chunk under KEY in its slot 0."""
    _, pool, _ = rank
    config = MiniFlexConfig(ssd_dirs=(str(direct_dir),), ssd_bytes=1 << 20, ssd_io="threads")
    c = SSDCopier(config, pool, bytes(16))
    assert c.demote([SlotCopy(KEY, SlotId(1), SlotId(0))]) == set()
    yield c
    c.close()


def test_a_promotion_is_read_from_ssd_into_its_slot_before_its_layers_copy(
    rank: Rank, copier: SSDCopier
) -> None:
    kv, pool, mover = rank
    want = [layer_blocks(kv, layer, (0, 1)) for layer in range(2)]
    pool.array[1] = 0  # the CPU copy is gone: only the SSD copy holds the chunk
    steps = steps_of(kv, StepReads(copier, SlotGuard(), pool.slot_bytes, GEOMETRY))
    job = load(1, LoadTiming.LAYERWISE, promotions=(SlotCopy(KEY, SlotId(1), SlotId(0)),))
    steps.issue([job], mover, before_forward=True)
    for name in kv:
        steps.wait_layer(name)
    (res,) = steps.finish()
    assert res.ok and not res.failed_block_ids and not res.failed_keys
    assert res.io == "threads"
    assert all(torch.equal(layer_blocks(kv, i, (6, 7)), want[i]) for i in range(2))


def test_a_promotion_missing_from_ssd_fails_only_its_blocks(rank: Rank, copier: SSDCopier) -> None:
    kv, pool, mover = rank
    want = [layer_blocks(kv, layer, (0, 1)) for layer in range(2)]
    steps = steps_of(kv, StepReads(copier, SlotGuard(), pool.slot_bytes, GEOMETRY))
    gone = ChunkKey(0xDEAD)  # never written to SSD
    chunks = (
        ChunkMove(SlotId(1), (BlockId(4), BlockId(5))),  # a CPU hit
        ChunkMove(SlotId(2), (BlockId(6), BlockId(7))),  # promoted into slot 2
    )
    promoted = TransferJob(
        JobId(1),
        ReqId("r1"),
        JobKind.LOAD,
        chunks,
        timing=LoadTiming.LAYERWISE,
        promotions=(SlotCopy(gone, SlotId(2), SlotId(3)),),
    )
    steps.issue([promoted], mover, before_forward=True)
    steps.wait_all()
    (res,) = steps.finish()
    assert res.ok and res.failed_keys == (gone,)
    assert res.failed_block_ids == (6, 7)  # slot 1's CPU chunk loaded; vLLM recomputes 6-7
    assert steps.failed == {ReqId("r1")}
    assert all(torch.equal(layer_blocks(kv, i, (4, 5)), want[i]) for i in range(2))
