"""Shared fixtures of the CUDA mover tests: small vLLM-shaped caches, pools, movers."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator, Sequence

import pytest
import torch

from miniflex.gpu import pinning
from miniflex.gpu.base import KVMover
from miniflex.gpu.cpu_mover import TorchMover
from miniflex.gpu.synthetic import synthetic_caches
from miniflex.layout import KVGeometry, KVLayout, layout_from_tensors
from miniflex.plan import ChunkMove
from miniflex.pool import HostPool

LAYERS, HEADS, BLOCK, HEAD, BLOCKS, BPC = 4, 8, 16, 128, 64, 4

HAVE_CUPY = importlib.util.find_spec("cupy") is not None
try:
    HAVE_BINDINGS = importlib.util.find_spec("cuda.bindings") is not None
except ModuleNotFoundError:
    HAVE_BINDINGS = False

# (name, kwargs) of every mover variant the round-trip tests cover.
MOVERS = [
    pytest.param("kernel", {"ctas": 4}, id="kernel-4cta"),
    pytest.param("kernel", {"ctas": 32}, id="kernel-32cta"),
    pytest.param("kernel", {"ctas": 16, "vec": 8}, id="kernel-16cta-vec8"),
    pytest.param("dma", {}, id="dma"),
    pytest.param("dma", {"batch_api": False}, id="dma-memcpy"),
    pytest.param("staged", {}, id="staged"),
    pytest.param("staged", {"direct_stores": False}, id="staged-lane-stores"),
    # One slot per lane, two lanes: every call cycles the lanes (their events) many times.
    pytest.param(
        "staged",
        {"lanes": 2, "lane_bytes": 1, "ctas": 3, "direct_stores": False},
        id="staged-2x1slot-lane-stores",
    ),
    pytest.param("staged", {"lanes": 3, "lane_bytes": 1}, id="staged-3x1slot"),
    pytest.param("cpu", {}, id="torch"),
]


def geometry(dtype: torch.dtype = torch.bfloat16, bpc: int = BPC) -> KVGeometry:
    return KVGeometry(
        num_layers=LAYERS,
        num_kv_heads=HEADS,
        head_size=HEAD,
        block_size=BLOCK,
        dtype=str(dtype).removeprefix("torch."),
        itemsize=dtype.itemsize,
        blocks_per_chunk=bpc,
    )


def caches(
    order: str = "LBHNC", dtype: torch.dtype = torch.bfloat16, pad_bytes: int = 0
) -> dict[str, torch.Tensor]:
    return synthetic_caches(geometry(dtype), order, BLOCKS, "cuda", pad_bytes=pad_bytes)


def make_mover(name: str, layout: KVLayout, kv: dict, pool: HostPool, **kw: object) -> KVMover:
    if name == "kernel":
        if not HAVE_CUPY:
            pytest.skip("the kernel mover needs CuPy")
        from miniflex.gpu.kernel_mover import KernelMover

        return KernelMover(layout, kv, pool, **kw)  # type: ignore[arg-type]
    if name == "dma":
        if not HAVE_BINDINGS:
            pytest.skip("the DMA mover needs cuda-bindings")
        from miniflex.gpu.dma_mover import DMAMover

        return DMAMover(layout, kv, pool, **kw)  # type: ignore[arg-type]
    if name == "staged":
        if not HAVE_CUPY:
            pytest.skip("the staged mover needs CuPy")
        from miniflex.gpu.staged_mover import StagedMover

        return StagedMover(layout, kv, pool, **kw)  # type: ignore[arg-type]
    return TorchMover(layout, kv, pool)


def page(t: torch.Tensor, block: int) -> torch.Tensor:
    """One block's page of one layer as its raw bytes in memory order (any dtype and order)."""
    u8 = t.view(torch.uint8)
    page_bytes = t[0].numel() * t.element_size()
    return torch.as_strided(u8, (page_bytes,), (1,), u8.storage_offset() + block * u8.stride(0))


def layout_of(kv: dict[str, torch.Tensor], bpc: int = BPC) -> KVLayout:
    return layout_from_tensors(kv, bpc)


@pytest.fixture
def pools() -> Iterator[Callable[[int, int], HostPool]]:
    """Make pools; each is unpinned (if a mover pinned it) and closed afterwards."""
    made: list[HostPool] = []

    def make(num_slots: int, slot_bytes: int) -> HostPool:
        pool = HostPool(num_slots, slot_bytes)
        made.append(pool)
        return pool

    yield make
    torch.cuda.synchronize()
    for pool in made:
        pinning.unpin(pool.address)
        pool.close()


def assert_pool_holds(
    pool: HostPool, chunks: Sequence[ChunkMove], kv: dict[str, torch.Tensor], g: KVGeometry
) -> None:
    """Each chunk's slot holds its blocks' pages in the documented format (layer-major)."""
    for c in chunks:
        slot = torch.from_numpy(pool.slot(c.slot).copy())
        for layer, t in enumerate(kv.values()):
            for j, b in enumerate(c.block_ids):
                off = g.chunk_offset(layer, j)
                assert torch.equal(slot[off : off + g.page_bytes], page(t, b).cpu())
