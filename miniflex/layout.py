"""KV tensor layouts: the only module that knows how vLLM lays out its KV cache.

vLLM 0.26-0.33 hand each attention layer to the connector as a 4-D *logical*
view ``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` (``[B, H, N, C]``;
K and V share the last axis). Physically the page of one block is contiguous
in one of two orders:

* ``LBNHC``: ``[block][token][head][k|v]`` (FlashAttention's "NHD"),
* ``LBHNC``: ``[block][head][token][k|v]`` ("HND").

An MLA model's *latent* cache (DeepSeek-V2/V3 style) has one "head" of
``kv_lora_rank + qk_rope_head_dim`` values per token and no separate V: its
view is ``[num_blocks, 1, block_size, head_size]`` (vLLM 0.26's MLA backends:
``[num_blocks, block_size, head_size]``, the same bytes). ``KVGeometry.latent``
says which; a page is ``heads * block_size * values * itemsize`` bytes either way.

Consecutive blocks sit ``block_stride`` bytes apart (a padded or
layer-interleaved cache has ``block_stride > page_bytes``). MiniFlex never
reorders bytes inside a page, so the two orders only differ in the namespace:
a chunk saved from one order is never loaded into the other.

A *chunk* is ``blocks_per_chunk`` blocks. In a CPU slot and on SSD it is one
contiguous run, layer-major::

    slot = [layer 0: page(block 0) page(block 1) ...][layer 1: ...] ...

so ``chunk_bytes = num_layers * blocks_per_chunk * page_bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from miniflex.errors import TransferError

__all__ = ["ALIGN", "KVGeometry", "KVLayout", "TensorLike", "align_up", "layout_from_tensors"]

ALIGN = 4096
"""Byte alignment of every slot in the CPU pool and on SSD (O_DIRECT's unit)."""

ORDERS = ("LBNHC", "LBHNC")


def align_up(n: int, align: int = ALIGN) -> int:
    return -(-n // align) * align


class TensorLike(Protocol):
    """What :func:`layout_from_tensors` reads of a tensor (torch.Tensor fits)."""

    @property
    def shape(self) -> Sequence[int]: ...

    @property
    def dtype(self) -> Any: ...

    def stride(self) -> Sequence[int]: ...

    def element_size(self) -> int: ...


@dataclass(frozen=True)
class KVGeometry:
    """Sizes both halves agree on; the scheduler builds it from the model config alone."""

    num_layers: int
    num_kv_heads: int
    head_size: int
    block_size: int
    dtype: str
    itemsize: int
    blocks_per_chunk: int
    latent: bool = False
    """MLA: ``head_size`` values per token and head (the latent vector), not K and V."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_size", "block_size", "itemsize"):
            assert getattr(self, name) > 0, f"{name} must be positive: {self}"
        assert self.blocks_per_chunk > 0

    @property
    def values_per_token(self) -> int:
        """Values one head caches per token: K and V, or one latent vector."""
        return self.head_size if self.latent else 2 * self.head_size

    @property
    def page_bytes(self) -> int:
        """KV bytes of one block of one layer."""
        return self.num_kv_heads * self.block_size * self.values_per_token * self.itemsize

    @property
    def chunk_tokens(self) -> int:
        return self.block_size * self.blocks_per_chunk

    @property
    def chunk_bytes(self) -> int:
        """KV bytes of one chunk across all layers."""
        return self.num_layers * self.blocks_per_chunk * self.page_bytes

    @property
    def slot_bytes(self) -> int:
        """Bytes one chunk occupies in the pool or on SSD.

        ``chunk_bytes`` rounded up to a multiple of both 4 KiB (O_DIRECT) and
        ``page_bytes``, so that the whole pool is also an array of pages and a
        copy addresses any page of any slot with one row index.
        """
        return align_up(self.chunk_bytes, math.lcm(ALIGN, self.page_bytes))

    def chunk_offset(self, layer: int, block_in_chunk: int) -> int:
        """Byte offset of a block's page inside a chunk (layer-major)."""
        return (layer * self.blocks_per_chunk + block_in_chunk) * self.page_bytes


@dataclass(frozen=True)
class KVLayout:
    """Geometry plus where vLLM's pages physically are (worker side only)."""

    geometry: KVGeometry
    order: str
    num_blocks: int
    block_stride: int
    """Bytes between block ``b`` and ``b + 1`` of one layer."""

    def __post_init__(self) -> None:
        assert self.order in ORDERS, self.order
        assert self.block_stride >= self.geometry.page_bytes

    @property
    def name(self) -> str:
        return self.order


def layout_from_tensors(
    kv_caches: Mapping[str, TensorLike], blocks_per_chunk: int, latent: bool = False
) -> KVLayout:
    """Describe vLLM's per-layer KV views; raise TransferError for a layout MiniFlex can't move.

    Every layer must have the same shape, dtype and strides. Example: a 2-layer
    fp16 cache of 10 blocks of 32 tokens, 2 heads, head size 64 has shape
    ``(10, 2, 32, 128)`` per layer and gives ``page_bytes = 2*32*128*2 = 16384``.
    ``latent``: an MLA cache, ``(10, 1, 32, 576)`` (or ``(10, 32, 576)``), head size 576.
    """
    if not kv_caches:
        raise TransferError("no KV cache tensors were registered")
    tensors = list(kv_caches.values())
    first = tensors[0]
    for name, t in kv_caches.items():
        if tuple(t.shape) != tuple(first.shape) or t.dtype != first.dtype:
            raise TransferError(
                f"layer {name} has shape {tuple(t.shape)} {t.dtype}, unlike the first layer's "
                f"{tuple(first.shape)} {first.dtype}; MiniFlex needs uniform attention layers"
            )
        if tuple(t.stride()) != tuple(first.stride()):
            raise TransferError(f"layer {name} has strides {tuple(t.stride())}, unlike the others")
    shape, strides = _bhnc(first, latent)
    num_blocks, heads, block_size, c = shape
    s_b, s_h, s_n, s_c = strides
    if s_c != 1:
        raise TransferError(f"KV cache strides {tuple(first.stride())}: last axis not contiguous")
    if latent and s_n == c:
        order = "LBHNC"  # one head: both orders are the same bytes
    elif s_n == c and s_h == block_size * c:
        order = "LBHNC"
    elif s_h == c and s_n == heads * c:
        order = "LBNHC"
    else:
        raise TransferError(
            f"KV cache strides {tuple(first.stride())} for shape {tuple(first.shape)} are neither "
            f"LBNHC nor LBHNC; only layouts with contiguous pages ({', '.join(ORDERS)}) "
            "are supported"
        )
    geometry = KVGeometry(
        num_layers=len(tensors),
        num_kv_heads=heads,
        head_size=c if latent else c // 2,
        block_size=block_size,
        dtype=str(first.dtype).removeprefix("torch."),
        itemsize=int(first.element_size()),
        blocks_per_chunk=blocks_per_chunk,
        latent=latent,
    )
    return KVLayout(
        geometry=geometry,
        order=order,
        num_blocks=num_blocks,
        block_stride=s_b * int(first.element_size()),
    )


def _bhnc(t: TensorLike, latent: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape and strides of a layer's view as ``[B, H, N, C]`` (elements)."""
    shape, strides = tuple(int(x) for x in t.shape), tuple(int(x) for x in t.stride())
    if latent and len(shape) == 3:  # [B, N, C]: one latent head
        return (shape[0], 1, shape[1], shape[2]), (strides[0], shape[1] * shape[2], *strides[1:])
    if len(shape) != 4 or not (latent or shape[3] % 2 == 0):
        expected = (
            "[num_blocks, 1, block_size, head_size]"
            if latent
            else ("[num_blocks, kv_heads, block_size, 2*head_size]")
        )
        raise TransferError(
            f"KV cache shape {shape} is not {expected} (vLLM 0.26-0.33); this vLLM version "
            "or attention backend is unsupported"
        )
    return shape, strides
