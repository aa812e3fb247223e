"""Synthetic vLLM-shaped KV caches and chunk moves, for tuning, benchmarks and tests.

The geometry comes from a Hugging Face ``config.json`` alone (as the
scheduler sees it); the tensors are per-layer logical ``[B, H, N, 2D]`` views
with vLLM's physical page orders, optionally padded between blocks.

Example (Qwen3-8B: 36 layers, 8 KV heads of 128, bf16, 64-token chunks)::

    g = kv_geometry(load_model_config("bench/models/qwen3-8b-shape"), 16, "bfloat16", 64)
    kv = synthetic_caches(g, "LBHNC", num_blocks=1024, device="cuda")
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from miniflex.errors import ConfigError
from miniflex.layout import KVGeometry
from miniflex.plan import ChunkMove
from miniflex.types import BlockId, SlotId

__all__ = ["DTYPES", "kv_geometry", "load_model_config", "random_chunks", "synthetic_caches"]

DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp8": torch.float8_e4m3fn,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "float8_e5m2": torch.float8_e5m2,
}


def load_model_config(path: str | Path) -> dict[str, Any]:
    """A model's ``config.json`` (``path`` is the file or its directory)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError("model", str(path), f"a readable config.json ({exc})") from exc
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]  # multimodal wrappers keep the language model's config here
    return cfg


def kv_geometry(
    model_config: Mapping[str, Any],
    block_size: int,
    dtype: str,
    chunk_tokens: int,
    tensor_parallel: int = 1,
) -> KVGeometry:
    """One TP rank's KV geometry: ``num_key_value_heads / tensor_parallel`` heads per layer."""
    if dtype not in DTYPES:
        raise ConfigError("dtype", dtype, "one of " + ", ".join(DTYPES))
    if chunk_tokens < block_size or chunk_tokens % block_size:
        raise ConfigError(
            "chunk_tokens", chunk_tokens, f"a multiple of the block size {block_size}"
        )
    try:
        layers = int(model_config["num_hidden_layers"])
        heads = int(model_config["num_attention_heads"])
        kv_heads = int(model_config.get("num_key_value_heads") or heads)
        head = int(model_config.get("head_dim") or int(model_config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            "model",
            "config.json",
            "num_hidden_layers, num_attention_heads and head_dim or hidden_size "
            f"(missing or bad: {exc})",
        ) from exc
    if tensor_parallel < 1 or (kv_heads % tensor_parallel and tensor_parallel % kv_heads):
        raise ConfigError(
            "tensor_parallel", tensor_parallel, f"a divisor or multiple of {kv_heads} KV heads"
        )
    t = DTYPES[dtype]
    return KVGeometry(
        num_layers=layers,
        num_kv_heads=max(1, kv_heads // tensor_parallel),  # vLLM replicates past kv_heads
        head_size=head,
        block_size=block_size,
        dtype=str(t).removeprefix("torch."),
        itemsize=t.itemsize,
        blocks_per_chunk=chunk_tokens // block_size,
    )


def synthetic_caches(
    geometry: KVGeometry,
    order: str,
    num_blocks: int,
    device: str | torch.device,
    pad_bytes: int = 0,
    fill: bool = True,
) -> dict[str, torch.Tensor]:
    """Per-layer ``[B, H, N, 2D]`` views like vLLM's, ``page_bytes + pad_bytes`` apart.

    ``fill`` writes random bytes (for bit-exact checks); without it the memory
    is left as allocated (for timing).
    """
    g = geometry
    t = DTYPES[g.dtype]
    stride = g.page_bytes + pad_bytes
    assert stride % g.itemsize == 0, "padding must be whole elements"
    out = {}
    for layer in range(g.num_layers):
        raw = torch.empty((num_blocks, stride), dtype=torch.uint8, device=device)
        if fill:
            raw.random_(0, 256)
        pages = raw[:, : g.page_bytes].view(t)
        c2 = 2 * g.head_size
        if order == "LBNHC":
            view = pages.view(num_blocks, g.block_size, g.num_kv_heads, c2).permute(0, 2, 1, 3)
        elif order == "LBHNC":
            view = pages.view(num_blocks, g.num_kv_heads, g.block_size, c2)
        else:
            raise ConfigError("order", order, "LBNHC or LBHNC")
        out[f"model.layers.{layer}.self_attn"] = view
    return out


def random_chunks(
    num_chunks: int,
    blocks_per_chunk: int,
    num_blocks: int,
    num_slots: int,
    rng: random.Random,
) -> list[ChunkMove]:
    """Whole chunks on distinct random slots, from distinct random (non-contiguous) blocks."""
    assert num_chunks * blocks_per_chunk <= num_blocks and num_chunks <= num_slots
    blocks = rng.sample(range(num_blocks), num_chunks * blocks_per_chunk)
    slots = rng.sample(range(num_slots), num_chunks)
    return [
        ChunkMove(
            SlotId(s),
            tuple(BlockId(b) for b in blocks[i * blocks_per_chunk : (i + 1) * blocks_per_chunk]),
        )
        for i, s in enumerate(slots)
    ]
