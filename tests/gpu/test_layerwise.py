"""Layerwise loads on CUDA: each layer's bytes are in place once its wait is on the stream."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest
import torch

from miniflex.gpu.base import LayerGate
from miniflex.gpu.synthetic import random_chunks, synthetic_caches
from miniflex.plan import ChunkMove
from miniflex.types import BlockId, SlotId
from tests.gpu.conftest import (
    BLOCKS,
    BPC,
    MOVERS,
    caches,
    geometry,
    layout_of,
    make_mover,
    page,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SLEEP_CYCLES = 200_000_000  # ~0.1 s of GPU time: the load is still queued when layers are read


def moved_elsewhere(chunks: list[ChunkMove], offset: int) -> list[ChunkMove]:
    """The same slots loaded into other blocks (``offset`` blocks further, modulo BLOCKS)."""
    return [
        ChunkMove(c.slot, tuple(BlockId((b + offset) % BLOCKS) for b in c.block_ids))
        for c in chunks
    ]


@pytest.mark.parametrize(("name", "kw"), MOVERS)
def test_each_layer_is_exact_once_waited_for(pools, name, kw) -> None:
    """The load waits behind slow work (its fence); a reader that waits per layer sees the bytes."""
    src, dst = caches(), caches()
    layout = layout_of(src)
    g = layout.geometry
    pool = pools(8, g.slot_bytes)
    # Distinct blocks: the 8 chunks below must not share a destination block.
    chunks = [
        ChunkMove(SlotId(c.slot), c.block_ids)
        for c in random_chunks(8, BPC, BLOCKS // 2, 8, random.Random(5))
    ]
    make_mover(name, layout, src, pool, **kw).store(chunks)
    mover = make_mover(name, layout_of(dst), dst, pool, **kw)
    back = moved_elsewhere(chunks, BLOCKS // 2)
    slow = torch.cuda.Stream()
    with torch.cuda.stream(slow):  # vLLM's earlier work, which the load must follow
        torch.cuda._sleep(SLEEP_CYCLES)
        fence = mover.fence()
    load = mover.load_layerwise(back, after=fence)
    seen = []
    reader = torch.cuda.Stream()
    with torch.cuda.stream(reader):  # stands in for the forward, layer by layer
        for layer, t in enumerate(dst.values()):
            load.wait_layer(layer)
            seen.append(t.clone())
    assert load.wait() == 8 * g.chunk_bytes
    reader.synchronize()
    for (lname, s), got in zip(src.items(), seen, strict=True):
        for c, d in zip(chunks, back, strict=True):
            for bs, bd in zip(c.block_ids, d.block_ids, strict=True):
                assert torch.equal(page(s, bs), page(got, bd)), f"{lname}: {bs} -> {bd}"


@pytest.mark.parametrize(("name", "kw"), MOVERS)
def test_partial_chunk_layerwise_moves_only_its_blocks(pools, name, kw) -> None:
    src, dst = caches(), caches()
    layout = layout_of(src)
    pool = pools(2, layout.geometry.slot_bytes)
    make_mover(name, layout, src, pool, **kw).store(
        [ChunkMove(SlotId(1), tuple(BlockId(b) for b in (4, 5, 6, 7)))]
    )
    before = {n: t.clone() for n, t in dst.items()}
    mover = make_mover(name, layout_of(dst), dst, pool, **kw)
    load = mover.load_layerwise([ChunkMove(SlotId(1), (BlockId(40), BlockId(41)), first=1)])
    assert load.wait() == 2 * layout.geometry.num_layers * layout.geometry.page_bytes
    for (lname, s), d, b in zip(src.items(), dst.values(), before.values(), strict=True):
        assert torch.equal(page(s, 5), page(d, 40)) and torch.equal(page(s, 6), page(d, 41))
        for blk in set(range(BLOCKS)) - {40, 41}:
            assert torch.equal(page(b, blk), page(d, blk)), f"{lname}: block {blk} changed"


@pytest.mark.parametrize(("name", "kw"), [m for m in MOVERS if m.values[0] != "cpu"])
def test_layerwise_loads_beside_transfer_thread_copies(pools, name, kw) -> None:
    """One mover: vLLM's thread loads layerwise while the transfer thread copies other slots."""
    x, z = caches(), caches()
    layout = layout_of(x)
    pool = pools(16, layout.geometry.slot_bytes)
    low = [ChunkMove(SlotId(s), tuple(BlockId(4 * s + j) for j in range(BPC))) for s in range(8)]
    high = [ChunkMove(SlotId(8 + c.slot), c.block_ids) for c in low]
    make_mover("cpu", layout, z, pool).store(high)  # slots 8-15 hold z's blocks 0-31
    original = {n: t.clone() for n, t in x.items()}
    mover = make_mover(name, layout, x, pool, **kw)
    errors: list[BaseException] = []

    def transfer_thread() -> None:  # x's blocks 0-31 -> slots 0-7 -> back again
        try:
            for _ in range(10):
                mover.store(low)
                mover.load(low)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=transfer_thread)
    thread.start()
    for _ in range(10):  # x's blocks 32-63 <- slots 8-15 (z's pages)
        load = mover.load_layerwise(moved_elsewhere(high, 32))
        for layer in range(layout.geometry.num_layers):
            load.wait_layer(layer)
        load.wait()
    thread.join()
    torch.cuda.synchronize()
    assert not errors, errors
    for s, o, d in zip(z.values(), original.values(), x.values(), strict=True):
        for b in range(32):
            assert torch.equal(page(o, b), page(d, b))
            assert torch.equal(page(s, b), page(d, b + 32))


@pytest.mark.parametrize("name", ["kernel", "staged"])
def test_a_large_layerwise_load_runs_on_more_ctas_and_is_exact(pools, name) -> None:
    """256 pages a layer: the default kernel launches ``LAYERWISE_CTAS`` per layer."""
    from miniflex.gpu.kernel_mover import LAYERWISE_CTAS, layerwise_ctas

    blocks, chunks_n = 1024, 64
    src = synthetic_caches(geometry(), "LBHNC", blocks, "cuda")
    dst = synthetic_caches(geometry(), "LBHNC", blocks, "cuda")
    layout = layout_of(src)
    pool = pools(chunks_n, layout.geometry.slot_bytes)
    chunks = [
        ChunkMove(SlotId(c.slot), c.block_ids)
        for c in random_chunks(chunks_n, BPC, blocks // 2, chunks_n, random.Random(9))
    ]
    make_mover(name, layout, src, pool).store(chunks)
    mover = make_mover(name, layout_of(dst), dst, pool)
    launched: list[int] = []
    real = mover._launch  # type: ignore[attr-defined]

    def counting(*args: object) -> None:
        launched.append(args[-1])  # type: ignore[arg-type]
        real(*args)

    mover._launch = counting  # type: ignore[attr-defined]
    back = [ChunkMove(c.slot, tuple(BlockId(b + blocks // 2) for b in c.block_ids)) for c in chunks]
    assert mover.load_layerwise(back).wait() == chunks_n * layout.geometry.chunk_bytes
    assert layerwise_ctas(chunks_n * BPC) == LAYERWISE_CTAS
    assert launched == [LAYERWISE_CTAS] * layout.geometry.num_layers
    for s, d in zip(src.values(), dst.values(), strict=True):
        for c, b in zip(chunks, back, strict=True):
            for bs, bd in zip(c.block_ids, b.block_ids, strict=True):
                assert torch.equal(page(s, bs), page(d, bd))


@pytest.mark.parametrize(("name", "kw"), MOVERS)
def test_a_gated_load_copies_each_layer_only_once_its_bytes_are_in(pools, name, kw) -> None:
    """As an in-step SSD read: the slots hold garbage until a reader thread fills them layer
    by layer and opens the gate; a layer copied before its gate opened would be garbage."""
    src, dst = caches(), caches()
    layout = layout_of(src)
    g = layout.geometry
    pool = pools(4, g.slot_bytes)
    chunks = [
        ChunkMove(SlotId(s), tuple(BlockId(s * BPC + j) for j in range(BPC))) for s in range(4)
    ]
    make_mover(name, layout, src, pool, **kw).store(chunks)
    good = [np.array(pool.slot(s), copy=True) for s in range(4)]
    for s in range(4):
        pool.slot(s)[:] = 0xA5
    mover = make_mover(name, layout_of(dst), dst, pool, **kw)
    gate = LayerGate(g.num_layers)
    layer_bytes = g.blocks_per_chunk * g.page_bytes

    def read_in() -> None:
        for layer in range(g.num_layers):
            time.sleep(0.02)
            lo, hi = layer * layer_bytes, (layer + 1) * layer_bytes
            for s in range(4):
                pool.slot(s)[lo:hi] = good[s][lo:hi]
            gate.open_through(layer)

    # The reads start first, as StepLoads.issue starts them: a mover without layer-by-layer
    # copies (the torch mover) waits for the whole gate inside load_layerwise.
    thread = threading.Thread(target=read_in)
    thread.start()
    load = mover.load_layerwise(moved_elsewhere(chunks, BLOCKS // 2), gate=gate)
    seen = []
    for t in dst.values():  # the forward, layer by layer
        load.wait_layer(len(seen))
        seen.append(t.clone())
    assert load.wait() == 4 * g.chunk_bytes
    thread.join()
    torch.cuda.synchronize()
    for (lname, s), got in zip(src.items(), seen, strict=True):
        for c in chunks:
            for b in c.block_ids:
                assert torch.equal(page(s, b), page(got, (b + BLOCKS // 2) % BLOCKS)), lname
