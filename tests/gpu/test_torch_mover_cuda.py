"""The torch mover on CUDA (run on the GPU machine; skipped where there is no CUDA)."""

from __future__ import annotations

import pytest
import torch

from miniflex.gpu.cpu_mover import TorchMover
from miniflex.layout import layout_from_tensors
from miniflex.plan import ChunkMove
from miniflex.pool import HostPool
from miniflex.types import BlockId, SlotId

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

BLOCKS, HEADS, BLOCK, HEAD, LAYERS, BPC = 64, 8, 16, 128, 4, 4
DTYPES = [torch.bfloat16, torch.float16, torch.float8_e4m3fn]


def cache(order: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """vLLM-style logical [B, H, N, 2D] views of per-layer CUDA buffers."""
    out = {}
    for layer in range(LAYERS):
        raw = torch.randint(
            0,
            256,
            (BLOCKS * HEADS * BLOCK * 2 * HEAD * dtype.itemsize,),
            dtype=torch.uint8,
            device="cuda",
        ).view(dtype)
        if order == "LBNHC":
            t = raw.view(BLOCKS, BLOCK, HEADS, 2 * HEAD).permute(0, 2, 1, 3)
        else:
            t = raw.view(BLOCKS, HEADS, BLOCK, 2 * HEAD)
        out[f"layer{layer}"] = t
    return out


def as_bytes(t: torch.Tensor, block: int) -> bytes:
    return t[block].contiguous().view(torch.uint8).cpu().numpy().tobytes()


@pytest.mark.parametrize("order", ["LBNHC", "LBHNC"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_gpu_cpu_gpu_is_bit_exact(order: str, dtype: torch.dtype) -> None:
    src, dst = cache(order, dtype), cache(order, dtype)
    layout = layout_from_tensors(src, BPC)
    assert layout.order == order
    pool = HostPool(8, layout.geometry.slot_bytes)
    perm = torch.randperm(BLOCKS).tolist()
    chunks = [
        ChunkMove(SlotId(7 - i), tuple(BlockId(b) for b in perm[i * BPC : (i + 1) * BPC]))
        for i in range(8)
    ]
    store, load = TorchMover(layout, src, pool), TorchMover(layout, dst, pool)
    store.store(chunks, after=store.fence())
    # load chunk i into the blocks chunk 7-i came from: a different placement
    back = [ChunkMove(c.slot, chunks[7 - i].block_ids) for i, c in enumerate(chunks)]
    load.load(back, after=load.fence())
    for t_src, t_dst in zip(src.values(), dst.values(), strict=True):
        for c, d in zip(chunks, back, strict=True):
            for b_src, b_dst in zip(c.block_ids, d.block_ids, strict=True):
                assert as_bytes(t_dst, b_dst) == as_bytes(t_src, b_src)
    pool.close()


def test_store_waits_for_work_queued_before_its_fence() -> None:
    """A store fenced after a (slow) write on vLLM's stream sees the written values."""
    src = cache("LBHNC", torch.bfloat16)
    layout = layout_from_tensors(src, BPC)
    pool = HostPool(1, layout.geometry.slot_bytes)
    mover = TorchMover(layout, src, pool)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # stands in for vLLM's forward stream
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the write lands
        for t in src.values():
            t[:BPC].fill_(3.0)
        fence = mover.fence()
    mover.store([ChunkMove(SlotId(0), tuple(BlockId(b) for b in range(BPC)))], after=fence)
    got = torch.from_numpy(pool.slot(SlotId(0))[: layout.geometry.chunk_bytes].copy())
    assert (got.view(torch.bfloat16) == 3.0).all()
    pool.close()
