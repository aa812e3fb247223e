"""KV layouts and the torch mover: bytes round-trip exactly through the CPU pool."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from miniflex.errors import ConfigError, TransferError
from miniflex.gpu.cpu_mover import TorchMover
from miniflex.layout import KVLayout, layout_from_tensors
from miniflex.plan import ChunkMove
from miniflex.pool import HostPool
from miniflex.types import BlockId, SlotId

BLOCKS, HEADS, BLOCK, HEAD = 24, 2, 32, 16
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
if hasattr(torch, "float8_e4m3fn"):
    DTYPES.append(torch.float8_e4m3fn)


def make_cache(
    order: str, dtype: torch.dtype, layers: int, pad: int = 0
) -> dict[str, torch.Tensor]:
    """Per-layer logical [B, H, N, 2D] views over one buffer, like vLLM allocates them.

    ``pad`` extra elements per block model a padded page; the layers share one
    buffer interleaved block-first (B, L, ...), so the block stride spans all
    layers, the hardest case for stride arithmetic.
    """
    page = HEADS * BLOCK * 2 * HEAD
    raw = torch.randint(
        0, 256, (BLOCKS * layers * (page + pad) * dtype.itemsize,), dtype=torch.uint8
    )
    flat = raw.view(dtype)
    caches = {}
    for layer in range(layers):
        if order == "LBNHC":  # memory [B][N][H][C]
            shape = (BLOCKS, HEADS, BLOCK, 2 * HEAD)
            stride = (layers * (page + pad), 2 * HEAD, HEADS * 2 * HEAD, 1)
        else:  # LBHNC, memory [B][H][N][C]
            shape = (BLOCKS, HEADS, BLOCK, 2 * HEAD)
            stride = (layers * (page + pad), BLOCK * 2 * HEAD, 2 * HEAD, 1)
        caches[f"model.layers.{layer}.self_attn"] = torch.as_strided(
            flat, shape, stride, storage_offset=layer * (page + pad)
        )
    return caches


def page_bytes(t: torch.Tensor, block: int, order: str) -> bytes:
    b = t[block]
    phys = b.permute(1, 0, 2) if order == "LBNHC" else b
    return phys.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("order", ["LBNHC", "LBHNC"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pad", [0, 64])
def test_chunks_round_trip_bit_exact(order: str, dtype: torch.dtype, pad: int) -> None:
    layers, bpc = 3, 2
    src = make_cache(order, dtype, layers, pad)
    layout = layout_from_tensors(src, blocks_per_chunk=bpc)
    assert layout.order == order and layout.geometry.dtype == str(dtype).removeprefix("torch.")
    assert layout.geometry.page_bytes == HEADS * BLOCK * 2 * HEAD * dtype.itemsize

    pool = HostPool(num_slots=5, slot_bytes=layout.geometry.slot_bytes)
    gen = torch.Generator().manual_seed(0)
    perm = torch.randperm(BLOCKS, generator=gen).tolist()
    chunks = [
        ChunkMove(SlotId(s), tuple(BlockId(b) for b in perm[2 * i : 2 * i + 2]))
        for i, s in enumerate([4, 0, 2])
    ]
    assert TorchMover(layout, src, pool).store(chunks) == 3 * layout.geometry.chunk_bytes

    # The slot holds the pages layer-major, exactly as docs/ and layout.py say.
    g = layout.geometry
    for c in chunks:
        slot = pool.slot(c.slot)
        for layer, t in enumerate(src.values()):
            for j, block in enumerate(c.block_ids):
                off = g.chunk_offset(layer, j)
                assert slot[off : off + g.page_bytes].tobytes() == page_bytes(t, block, order)

    # Load into different blocks of a second cache with another random content.
    dst = make_cache(order, dtype, layers, pad)
    targets = [
        ChunkMove(c.slot, tuple(BlockId(b) for b in perm[-2 * i - 2 : len(perm) - 2 * i]))
        for i, c in enumerate(chunks)
    ]
    untouched = [b for b in range(BLOCKS) if all(b not in t.block_ids for t in targets)]
    before = {(n, b): page_bytes(t, b, order) for n, t in dst.items() for b in untouched}
    TorchMover(layout_from_tensors(dst, bpc), dst, pool).load(targets)
    for (name, t_src), t_dst in zip(src.items(), dst.values(), strict=True):
        for c, t in zip(chunks, targets, strict=True):
            for b_src, b_dst in zip(c.block_ids, t.block_ids, strict=True):
                assert page_bytes(t_dst, b_dst, order) == page_bytes(t_src, b_src, order), name
    assert before == {(n, b): page_bytes(t, b, order) for n, t in dst.items() for b in untouched}
    pool.close()


def test_unsupported_shapes_and_mixed_layers_are_readable_errors() -> None:
    with pytest.raises(TransferError, match="num_blocks, kv_heads"):
        layout_from_tensors({"l0": torch.zeros(2, 4, 8, 16, 8)}, 1)
    with pytest.raises(TransferError, match="unlike the first"):
        layout_from_tensors({"a": torch.zeros(4, 2, 32, 8), "b": torch.zeros(4, 2, 32, 16)}, 1)
    swapped = torch.zeros(2, 32, 4, 8).permute(2, 0, 1, 3)  # heads outermost: not page-contiguous
    with pytest.raises(TransferError, match="neither"):
        layout_from_tensors({"a": swapped}, 1)
    with pytest.raises(TransferError, match="no KV cache"):
        layout_from_tensors({}, 1)


def test_mover_rejects_bad_block_ids() -> None:
    cache = make_cache("LBNHC", torch.float16, 1)
    layout: KVLayout = layout_from_tensors(cache, 2)
    pool = HostPool(2, layout.geometry.slot_bytes)
    mover = TorchMover(layout, cache, pool)
    with pytest.raises(TransferError, match=r"covers blocks 1\.\.3 of a 2-block chunk"):
        mover.store([ChunkMove(SlotId(0), (BlockId(1), BlockId(2)), first=1)])
    with pytest.raises(TransferError, match=r"outside 0\.\.23"):
        mover.load([ChunkMove(SlotId(0), (BlockId(1), BlockId(99)))])


def test_partial_chunk_load_touches_only_its_blocks() -> None:
    """A load starting inside a chunk (GPU already has block 0) writes only block 1."""
    src = make_cache("LBHNC", torch.bfloat16, 2)
    layout = layout_from_tensors(src, 2)
    pool = HostPool(1, layout.geometry.slot_bytes)
    TorchMover(layout, src, pool).store([ChunkMove(SlotId(0), (BlockId(3), BlockId(5)))])
    dst = make_cache("LBHNC", torch.bfloat16, 2)
    before = [page_bytes(t, 7, "LBHNC") for t in dst.values()]
    TorchMover(layout, dst, pool).load([ChunkMove(SlotId(0), (BlockId(8),), first=1)])
    for t_src, t_dst, old7 in zip(src.values(), dst.values(), before, strict=True):
        assert page_bytes(t_dst, 8, "LBHNC") == page_bytes(t_src, 5, "LBHNC")
        assert page_bytes(t_dst, 7, "LBHNC") == old7


def test_layerwise_load_on_host_memory_is_done_when_returned() -> None:
    """The CPU backend's layerwise load copies everything at once; the waits are no-ops."""
    src = make_cache("LBHNC", torch.bfloat16, 2)
    layout = layout_from_tensors(src, 2)
    pool = HostPool(2, layout.geometry.slot_bytes)
    chunks = [ChunkMove(SlotId(1), (BlockId(3), BlockId(5)))]
    TorchMover(layout, src, pool).store(chunks)
    dst = make_cache("LBHNC", torch.bfloat16, 2)
    load = TorchMover(layout, dst, pool).load_layerwise(
        [ChunkMove(SlotId(1), (BlockId(9), BlockId(2)))]
    )
    for t_src, t_dst in zip(src.values(), dst.values(), strict=True):  # before any wait
        assert page_bytes(t_dst, 9, "LBHNC") == page_bytes(t_src, 3, "LBHNC")
        assert page_bytes(t_dst, 2, "LBHNC") == page_bytes(t_src, 5, "LBHNC")
    load.wait_layer(0)
    assert load.wait() == 2 * layout.geometry.num_layers * layout.geometry.page_bytes


def test_jobs_larger_than_the_staging_buffer_move_in_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from miniflex.gpu import cpu_mover

    src = make_cache("LBNHC", torch.float16, 2)
    layout = layout_from_tensors(src, 2)
    monkeypatch.setattr(cpu_mover, "STAGING_BYTES", 3 * layout.geometry.page_bytes)
    pool = HostPool(6, layout.geometry.slot_bytes)
    chunks = [
        ChunkMove(SlotId(s), (BlockId(2 * s + 1), BlockId(2 * s))) for s in range(6)
    ]  # 12 pages per layer: four batches of three
    TorchMover(layout, src, pool).store(chunks)
    dst = make_cache("LBNHC", torch.float16, 2)
    TorchMover(layout, dst, pool).load(chunks)
    for t_src, t_dst in zip(src.values(), dst.values(), strict=True):
        for b in range(12):
            assert page_bytes(t_dst, b, "LBNHC") == page_bytes(t_src, b, "LBNHC")


def test_a_pool_file_is_never_shared_by_two_live_pools(tmp_path: Path) -> None:
    path = tmp_path / "pool.0"
    first = HostPool(2, 4096, path)
    first.slot(SlotId(1))[:4] = [1, 2, 3, 4]
    with pytest.raises(ConfigError, match="no other running engine"):
        HostPool(2, 4096, path)
    assert first.slot(SlotId(1))[:4].tolist() == [1, 2, 3, 4]  # not truncated by the attempt
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    first.close()
    assert not path.exists()
    path.write_bytes(b"left behind by a crashed engine")
    second = HostPool(2, 4096, path)  # unlocked: reused, zeroed and resized
    assert path.stat().st_size == 2 * 4096 and not second.slot(SlotId(0)).any()
    second.close()


def test_start_up_probe_times_both_load_paths_and_leaves_the_pool_alone() -> None:
    from miniflex.worker.probe import probe_loads

    kv = make_cache("LBHNC", torch.bfloat16, 2)
    layout = layout_from_tensors(kv, 2)
    pool = HostPool(4, layout.geometry.slot_bytes)
    pool.array[:] = 7
    block0 = [page_bytes(t, 0, "LBHNC") for t in kv.values()]
    probe = probe_loads(TorchMover(layout, kv, pool), layout, num_slots=4)
    assert probe is not None
    # min(32 chunks, 4 slots, (24 blocks - 1) // 2): every slot, into blocks 1-8
    assert probe.num_bytes == 4 * layout.geometry.chunk_bytes
    assert probe.load_seconds > 0 and probe.layerwise_seconds > 0
    assert (pool.array == 7).all()
    for t, before in zip(kv.values(), block0, strict=True):
        assert page_bytes(t, 0, "LBHNC") == before  # vLLM's null block is not written
        assert set(page_bytes(t, 8, "LBHNC")) == {7}  # the probe's last block was


def test_layerwise_loads_and_stores_from_two_threads_do_not_mix_their_bytes() -> None:
    """vLLM's thread loads layerwise while the transfer thread stores: one staging buffer."""
    import threading

    src, dst = make_cache("LBHNC", torch.bfloat16, 2), make_cache("LBHNC", torch.bfloat16, 2)
    layout = layout_from_tensors(src, 2)
    pool = HostPool(8, layout.geometry.slot_bytes)
    low = [ChunkMove(SlotId(s), (BlockId(2 * s), BlockId(2 * s + 1))) for s in range(4)]
    high = [ChunkMove(SlotId(4 + c.slot), c.block_ids) for c in low]
    TorchMover(layout, src, pool).store(high)  # slots 4-7: src blocks 0-7
    mover = TorchMover(layout, dst, pool)
    errors: list[BaseException] = []

    def transfer_thread() -> None:  # dst blocks 8-15 -> slots 0-3, again and again
        try:
            for _ in range(200):
                mover.store([ChunkMove(c.slot, tuple(BlockId(8 + b) for b in c.block_ids))
                             for c in low])  # fmt: skip
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=transfer_thread)
    thread.start()
    for _ in range(200):  # dst blocks 0-7 <- slots 4-7
        mover.load_layerwise(high).wait()
    thread.join()
    assert not errors, errors
    for t_src, t_dst in zip(src.values(), dst.values(), strict=True):
        for b in range(8):
            assert page_bytes(t_dst, b, "LBHNC") == page_bytes(t_src, b, "LBHNC")
    slot0 = torch.from_numpy(pool.slot(SlotId(0)).copy())
    g = layout.geometry
    for layer, t in enumerate(dst.values()):
        off = g.chunk_offset(layer, 0)
        assert bytes(slot0[off : off + g.page_bytes].numpy()) == page_bytes(t, 8, "LBHNC")


def test_a_latent_cache_is_one_head_of_head_size_values_in_either_shape() -> None:
    four_d = {"l0": torch.zeros(6, 1, 16, 576, dtype=torch.bfloat16)}
    three_d = {"l0": torch.zeros(6, 16, 576, dtype=torch.bfloat16)}  # vLLM 0.26's MLA view
    a, b = layout_from_tensors(four_d, 2, latent=True), layout_from_tensors(three_d, 2, latent=True)
    assert a == b
    assert a.geometry.head_size == 576 and a.geometry.num_kv_heads == 1
    assert a.geometry.page_bytes == 16 * 576 * 2 and a.block_stride == a.geometry.page_bytes
    # the same tensor read as K|V would be 288-value heads: other pages, never confused
    assert layout_from_tensors(four_d, 2).geometry.head_size == 288
