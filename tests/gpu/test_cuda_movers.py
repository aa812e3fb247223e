"""Every mover on CUDA: bytes survive GPU -> pool -> GPU exactly, in every shape a job takes."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from miniflex.errors import TransferError
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

DTYPES = [torch.bfloat16, torch.float16, torch.float8_e4m3fn]


def chunk(slot: int, blocks: list[int], first: int = 0) -> ChunkMove:
    return ChunkMove(SlotId(slot), tuple(BlockId(b) for b in blocks), first)


def assert_pages_equal(src: dict, src_blocks: list[int], dst: dict, dst_blocks: list[int]) -> None:
    for (name, s), d in zip(src.items(), dst.values(), strict=True):
        for bs, bd in zip(src_blocks, dst_blocks, strict=True):
            assert torch.equal(page(s, bs), page(d, bd)), f"{name}: block {bs} -> {bd} differs"


@pytest.mark.parametrize(("name", "kw"), MOVERS)
@pytest.mark.parametrize("order", ["LBNHC", "LBHNC"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_random_blocks_is_bit_exact(pools, name, kw, order, dtype) -> None:
    src, dst = caches(order, dtype), caches(order, dtype)
    layout = layout_of(src)
    assert layout.order == order
    pool = pools(8, layout.geometry.slot_bytes)
    chunks = random_chunks(8, BPC, BLOCKS, 8, random.Random(1))
    store = make_mover(name, layout, src, pool, **kw)
    assert store.store(chunks, after=store.fence()) == 8 * layout.geometry.chunk_bytes
    assert_pool_holds(pool, chunks, src, layout.geometry)
    # Load chunk i into the blocks chunk 7 - i came from: a different placement.
    back = [chunk(c.slot, list(chunks[7 - i].block_ids)) for i, c in enumerate(chunks)]
    load = make_mover(name, layout_of(dst), dst, pool, **kw)
    load.load(back, after=load.fence())
    for c, d in zip(chunks, back, strict=True):
        assert_pages_equal(src, list(c.block_ids), dst, list(d.block_ids))


@pytest.mark.parametrize(("name", "kw"), MOVERS)
def test_partial_chunks_load_only_their_blocks(pools, name, kw) -> None:
    """Loads may start inside a chunk (first > 0) and end early; other blocks stay untouched."""
    src, dst = caches(), caches()
    layout = layout_of(src)
    pool = pools(4, layout.geometry.slot_bytes)
    mover = make_mover(name, layout, src, pool, **kw)
    mover.store([chunk(0, [10, 3, 50, 7]), chunk(2, [1, 2, 3, 4])])
    before = {n: t.clone() for n, t in dst.items()}
    loads = [chunk(0, [60, 61], first=1), chunk(2, [9, 33, 20])]  # blocks 1-2 and 0-2
    make_mover(name, layout_of(dst), dst, pool, **kw).load(loads)
    assert_pages_equal(src, [3, 50, 1, 2, 3], dst, [60, 61, 9, 33, 20])
    untouched = sorted(set(range(BLOCKS)) - {60, 61, 9, 33, 20})
    assert_pages_equal(before, untouched, dst, untouched)


@pytest.mark.parametrize(("name", "kw"), MOVERS)
def test_contiguous_blocks_and_slots_round_trip(pools, name, kw) -> None:
    """Runs of consecutive blocks into consecutive rows: the DMA mover merges these copies."""
    src, dst = caches(), caches()
    layout = layout_of(src)
    pool = pools(4, layout.geometry.slot_bytes)
    chunks = [chunk(s, list(range(8 + 4 * s, 12 + 4 * s))) for s in range(4)]
    make_mover(name, layout, src, pool, **kw).store(chunks)
    make_mover(name, layout_of(dst), dst, pool, **kw).load(chunks)
    blocks = list(range(8, 24))
    assert_pages_equal(src, blocks, dst, blocks)


@pytest.mark.parametrize(("name", "kw"), MOVERS)
@pytest.mark.parametrize("pad_bytes", [16, 8], ids=["pad16", "pad8"])
def test_padded_cache_round_trips(pools, name, kw, pad_bytes) -> None:
    """block_stride > page_bytes: no run merging, and 8-byte padding forbids 16-byte access."""
    src, dst = caches(pad_bytes=pad_bytes), caches(pad_bytes=pad_bytes)
    layout = layout_of(src)
    assert layout.block_stride == layout.geometry.page_bytes + pad_bytes
    pool = pools(8, layout.geometry.slot_bytes)
    chunks = random_chunks(8, BPC, BLOCKS, 8, random.Random(2))
    store = make_mover(name, layout, src, pool, **kw)
    if name == "kernel":
        assert store.vec == (kw.get("vec") or pad_bytes)  # type: ignore[attr-defined]
    store.store(chunks)
    make_mover(name, layout_of(dst), dst, pool, **kw).load(chunks)
    for c in chunks:
        assert_pages_equal(src, list(c.block_ids), dst, list(c.block_ids))


@pytest.mark.skipif(not HAVE_CUPY, reason="the kernel mover needs CuPy")
def test_kernel_refuses_a_vector_width_the_alignment_forbids(pools) -> None:
    kv = caches(pad_bytes=8)
    layout = layout_of(kv)
    pool = pools(1, layout.geometry.slot_bytes)
    with pytest.raises(TransferError, match="block_stride"):
        make_mover("kernel", layout, kv, pool, vec=16)


@pytest.mark.parametrize(("name", "kw"), MOVERS)
def test_bad_chunks_raise_before_copying(pools, name, kw) -> None:
    kv = caches()
    layout = layout_of(kv)
    pool = pools(2, layout.geometry.slot_bytes)
    mover = make_mover(name, layout, kv, pool, **kw)
    with pytest.raises(TransferError, match="outside"):
        mover.load([chunk(0, [1, 2, 3, BLOCKS])])
    with pytest.raises(TransferError, match="covers blocks"):
        mover.load([chunk(1, [1, 2], first=3)])
    assert mover.store([]) == 0


@pytest.mark.parametrize(("name", "kw"), MOVERS)
def test_a_fresh_thread_stores_and_loads(pools, name, kw) -> None:
    """A worker's transfer threads make their first CUDA call through the mover (the staged
    mover's driver calls need the thread to have a current context)."""
    src, dst = caches(), caches()
    layout = layout_of(src)
    pool = pools(4, layout.geometry.slot_bytes)
    chunks = random_chunks(4, BPC, BLOCKS, 4, random.Random(5))
    store = make_mover(name, layout, src, pool, **kw)
    load = make_mover(name, layout_of(dst), dst, pool, **kw)
    fences = (store.fence(), load.fence())  # on this thread, as vLLM's thread makes them
    errors: list[BaseException] = []

    def run() -> None:
        try:
            store.store(chunks, after=fences[0])
            load.load(chunks, after=fences[1])
        except BaseException as exc:  # reported on the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert not errors, errors
    for c in chunks:
        assert_pages_equal(src, list(c.block_ids), dst, list(c.block_ids))


@pytest.mark.skipif(not HAVE_CUPY, reason="the staged mover needs CuPy")
@pytest.mark.parametrize("direct", [True, False], ids=["direct-stores", "lane-stores"])
def test_staged_stores_skip_the_lanes_unless_told(pools, direct) -> None:
    """By default a store writes the pool directly (no staging buffer, no copy engine);
    with ``direct_stores=False`` it goes through the lanes. Loads always use the lanes."""
    src, dst = caches(), caches()
    layout = layout_of(src)
    pool = pools(4, layout.geometry.slot_bytes)
    chunks = random_chunks(4, BPC, BLOCKS, 4, random.Random(7))
    mover = make_mover("staged", layout, src, pool, direct_stores=direct)
    staging = mover._staging  # type: ignore[attr-defined]
    staging.fill_(0xA5)
    torch.cuda.synchronize()  # the mover's streams do not wait for the default stream
    mover.store(chunks)
    assert_pool_holds(pool, chunks, src, layout.geometry)
    assert bool((staging == 0xA5).all()) is direct
    loader = make_mover("staged", layout_of(dst), dst, pool, direct_stores=direct)
    loader._staging.fill_(0xA5)  # type: ignore[attr-defined]
    torch.cuda.synchronize()
    loader.load(chunks)
    assert not bool((loader._staging == 0xA5).all())  # type: ignore[attr-defined]
    for c in chunks:
        assert_pages_equal(src, list(c.block_ids), dst, list(c.block_ids))
