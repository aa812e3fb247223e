"""CUDA movers and streams: fences order copies after vLLM's work; movers don't interfere."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from miniflex.gpu.synthetic import random_chunks
from miniflex.plan import ChunkMove
from miniflex.types import BlockId, SlotId
from tests.gpu.conftest import (
    BLOCKS,
    BPC,
    HAVE_CUPY,
    MOVERS,
    assert_pool_holds,
    caches,
    layout_of,
    make_mover,
    page,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SLEEP_CYCLES = 200_000_000  # ~0.1 s of GPU time before the other stream's write lands


def first_chunk() -> list[ChunkMove]:
    return [ChunkMove(SlotId(0), tuple(BlockId(b) for b in range(BPC)))]


@pytest.mark.parametrize(("name", "kw"), MOVERS)
def test_store_waits_for_work_queued_before_its_fence(pools, name, kw) -> None:
    """A store fenced after a slow write on vLLM's stream sees the written values."""
    kv = caches()
    layout = layout_of(kv)
    pool = pools(1, layout.geometry.slot_bytes)
    mover = make_mover(name, layout, kv, pool, **kw)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # stands in for vLLM's forward stream
        torch.cuda._sleep(SLEEP_CYCLES)
        for t in kv.values():
            t[:BPC].fill_(3.0)
        fence = mover.fence()
    mover.store(first_chunk(), after=fence)
    got = torch.from_numpy(pool.slot(SlotId(0))[: layout.geometry.chunk_bytes].copy())
    assert (got.view(torch.bfloat16) == 3.0).all()


@pytest.mark.parametrize(("name", "kw"), MOVERS)
def test_load_lands_after_work_queued_before_its_fence(pools, name, kw) -> None:
    """A load fenced after a slow write to the same blocks overwrites it, not the reverse."""
    src, dst = caches(), caches()
    layout = layout_of(src)
    pool = pools(1, layout.geometry.slot_bytes)
    make_mover(name, layout, src, pool, **kw).store(first_chunk())
    mover = make_mover(name, layout_of(dst), dst, pool, **kw)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        for t in dst.values():
            t[:BPC].fill_(3.0)
        fence = mover.fence()
    mover.load(first_chunk(), after=fence)
    torch.cuda.synchronize()
    for s, d in zip(src.values(), dst.values(), strict=True):
        for b in range(BPC):
            assert torch.equal(page(s, b), page(d, b))


def test_concurrent_loads_and_stores_do_not_interfere(pools) -> None:
    """Two movers on two threads: one stores slots 0-7 while the other loads slots 8-15."""
    names = ["kernel" if HAVE_CUPY else "cpu", "dma"]
    x, y, z = caches(), caches(), caches()
    layout = layout_of(x)
    pool = pools(16, layout.geometry.slot_bytes)
    rng = random.Random(3)
    stores = random_chunks(8, BPC, BLOCKS, 8, rng)
    loads = [
        ChunkMove(SlotId(8 + c.slot), c.block_ids) for c in random_chunks(8, BPC, BLOCKS, 8, rng)
    ]
    make_mover("cpu", layout, z, pool).store(loads)  # slots 8-15 hold z's pages
    storer = make_mover(names[0], layout, x, pool)
    loader = make_mover(names[1], layout_of(y), y, pool)
    errors: list[BaseException] = []

    def repeat(fn, chunks) -> None:
        try:
            for _ in range(20):
                fn(chunks)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=repeat, args=(storer.store, stores)),
        threading.Thread(target=repeat, args=(loader.load, loads)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert_pool_holds(pool, stores, x, layout.geometry)
    for c in loads:
        for s, d in zip(z.values(), y.values(), strict=True):
            for b in c.block_ids:
                assert torch.equal(page(s, b), page(d, b))


@pytest.mark.parametrize(("name", "kw"), MOVERS)
def test_waiting_for_a_fence_sleeps_without_the_interpreter_lock(pools, name, kw) -> None:
    """``wait_for`` (the store thread, before it issues a plan's stores) returns once the
    work before the fence is done; meanwhile it neither spins a core nor holds the lock."""
    kv = caches()
    layout = layout_of(kv)
    mover = make_mover(name, layout, kv, pools(1, layout.geometry.slot_bytes), **kw)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        fence = mover.fence()
    waited: dict[str, float] = {}

    def wait() -> None:
        cpu, t0 = time.thread_time(), time.perf_counter()
        mover.wait_for(fence)
        waited.update(cpu=time.thread_time() - cpu, wall=time.perf_counter() - t0)
        waited["done"] = float(fence.query())  # type: ignore[attr-defined]

    thread = threading.Thread(target=wait)
    thread.start()
    ticks = 0
    while thread.is_alive():  # this thread keeps running Python meanwhile
        ticks += 1
    thread.join()
    assert waited["done"] == 1.0
    assert waited["wall"] > 0.02, waited  # it did wait for the GPU's sleep
    assert waited["cpu"] < 0.5 * waited["wall"], waited  # asleep, not spinning
    assert ticks > 10_000
