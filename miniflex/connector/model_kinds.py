"""Which models MiniFlex serves, read from vLLM's KV cache config; a one-line refusal for the rest.

A prefix cache is only correct if the bytes it restores are everything the
model keeps about the prefix. MiniFlex copies whole pages of per-token KV, keyed
by the prefix's block hashes, so it refuses, at start-up, every model whose
cache holds something else:

* state that is not per token (Mamba / linear-attention layers keep one running
  state per request),
* pages vLLM frees while the request runs (sliding-window and chunked-local
  groups of the hybrid KV cache manager),
* KV that does not follow from the prefix alone (cross-attention over an
  encoder input, bidirectional attention, attention sinks),
* pages whose format MiniFlex has not verified (packed, sub-token or
  multi-state pages, quantization with per-token scales, any spec it does not
  know),
* and parallel layouts whose ranks do not all hold the same layers and tokens
  (pipeline or context parallelism), or that give each TP rank a scheduler of
  its own (vLLM's ``external_launcher``: one plan must drive every rank).

vLLM builds the KV cache config after loading the weights, so this runs then,
in every worker and in the scheduler, before the KV cache is allocated and
before warm-up or graph capture. The refusal is a :class:`ConfigError` whose
one-line message names the model, the KV cache spec and the reason, e.g.::

    MiniFlex config model='/models/jamba': KV cache group 1 of 2 is MambaSpec
    (4 layers, e.g. model.layers.0.mamba): a Mamba/linear-attention layer keeps
    one running state per request, ... ; MiniFlex does not save it at chunk
    boundaries

Served: one group of ``FullAttentionSpec``, including the sliding-window or
chunked-local layers that vLLM promotes to full attention when its hybrid KV
cache manager is off (it then keeps every block of every layer, so every page
MiniFlex stores is live); one group of ``MLAAttentionSpec`` (DeepSeek-V2/V3's
latent cache: one KV "head", the same on every TP rank). Several groups of full
and sliding-window attention (vLLM's hybrid KV cache manager on) are served by
``MiniFlexHMAConnector``, one group at a time (``hma_groups.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from miniflex.errors import ConfigError
from miniflex.layout import KVGeometry

__all__ = ["EngineLayout", "check_stateless", "geometry_for", "refusal_of_spec"]

_REASONS = {
    "MambaSpec": (
        "a Mamba/linear-attention layer keeps one running state per request, not KV per "
        "token; MiniFlex does not save that state at chunk boundaries, so a prefix hit "
        "would run the rest of the prompt from a missing state"
    ),
    "SlidingWindowSpec": (
        "vLLM's hybrid KV cache manager frees the blocks that leave the window while the "
        "request runs; a model of such layers only has no group whose prefix MiniFlex can "
        "store whole (one that mixes them with full-attention layers is served: whole by "
        "MiniFlexConnector, a window per hit by MiniFlexHMAConnector)"
    ),
    "ChunkedLocalAttentionSpec": (
        "vLLM's hybrid KV cache manager frees the blocks of finished attention chunks while "
        "the request runs; MiniFlex stores and loads whole prefixes of one group only"
    ),
    "CrossAttentionSpec": (
        "cross-attention KV is computed from the encoder input, not from the prompt prefix "
        "that MiniFlex's keys name"
    ),
    "EncoderOnlyAttentionSpec": "an encoder-only model keeps no KV cache between requests",
    "SinkFullAttentionSpec": (
        "attention sinks keep KV outside the per-token pages that MiniFlex copies"
    ),
    "MLAAttentionSpec": (
        "the MLA latent cache (one shared KV head, replicated over TP ranks) is not supported yet"
    ),
    "UniformTypeKVCacheSpecs": (
        "the layers of this group have different page sizes; a MiniFlex chunk needs uniform layers"
    ),
}
_UNKNOWN = (
    "a KV cache spec MiniFlex does not know; its pages may hold state that a prefix "
    "cache cannot restore"
)
_SERVED = frozenset({"FullAttentionSpec", "MLAAttentionSpec"})
_PLAIN_MLA_DTYPES = frozenset({None, "auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"})
"""MLA cache dtypes whose pages are plain values (``fp8_ds_mla`` and the fp4 formats pack
scales into the page)."""
_PLAIN_QUANT = frozenset({0, 1})
"""``KVQuantMode`` values whose pages are plain values: NONE, FP8_PER_TENSOR (one scale per
layer, kept with the weights)."""


@dataclass(frozen=True)
class EngineLayout:
    """What of vLLM's config decides whether MiniFlex can serve a model (plain values)."""

    model: str
    pipeline_parallel: int = 1
    context_parallel: int = 1
    """The larger of decode and prefill context parallelism."""
    tensor_parallel: int = 1
    rank_schedulers: bool = False
    """Each rank runs its own scheduler (vLLM's ``external_launcher`` executor)."""


def refusal_of_spec(spec: Any) -> str | None:
    """Why MiniFlex cannot store and restore pages of ``spec`` (None: it can)."""
    name = type(spec).__name__
    if name not in _SERVED:
        return _REASONS.get(name, _UNKNOWN)
    if getattr(spec, "non_causal", False):
        return (
            "the layers attend bidirectionally, so a block's KV depends on the tokens after it "
            "and not on its prefix alone"
        )
    quant = int(getattr(spec, "kv_quant_mode", 0) or 0)
    if quant not in _PLAIN_QUANT:
        return (
            f"KV cache quantization {getattr(spec.kv_quant_mode, 'name', quant)} keeps scales "
            "MiniFlex has not verified it restores; use an unquantized or fp8 KV cache"
        )
    if name == "MLAAttentionSpec":
        return _refusal_of_mla(spec)
    if getattr(spec, "head_size_v", None) not in (None, spec.head_size):
        return f"K and V head sizes differ ({spec.head_size} and {spec.head_size_v})"
    packed = any(
        getattr(spec, f, None) is not None for f in ("num_head_slots", "state_content_bytes")
    )
    if packed or getattr(spec, "tokens_per_state", 1) != 1:
        return "packed or multi-token pages, which MiniFlex has not verified it restores"
    return None


def _refusal_of_mla(spec: Any) -> str | None:
    dtype = getattr(spec, "cache_dtype_str", None)
    if dtype not in _PLAIN_MLA_DTYPES:
        return (
            f"MLA cache dtype {dtype!r} packs scales into its pages; MiniFlex has not verified it"
        )
    if getattr(spec, "model_version", None) is not None:
        return (
            f"the sparse MLA cache of {spec.model_version} (compressed states, indexer) is not a "
            "page of one latent vector per token"
        )
    return None


def check_stateless(model: str, state_arch: str | None) -> None:
    """Refuse a model whose layers keep a running state (``state_arch``: its architecture,
    from ``compat.state_model``; None: attention layers only) with a ConfigError.

    Runs when vLLM asks the connector for its KV layout (``get_required_kvcache_layout``),
    before it groups the layers into KV cache groups (vLLM 0.32: in the engine core, as it
    initializes the KV cache; 0.26: in the workers, as their attention backends describe
    the layers' KV caches). Without it, vLLM, which turns its hybrid KV cache manager
    off for ``MiniFlexConnector``, fails on such a model with "Failed to promote local KV
    cache specs to one unified type", which names neither the model nor MiniFlex.
    """
    if state_arch is not None:
        raise ConfigError(
            "model",
            model,
            f"{state_arch} has Mamba/linear-attention layers: {_REASONS['MambaSpec']}",
        )


def _describe(group: Any, index: int, count: int) -> str:
    layers = list(group.layer_names)
    first = f", e.g. {layers[0]}" if layers else ""
    return (
        f"KV cache group {index} of {count} is {type(group.kv_cache_spec).__name__} "
        f"({len(layers)} layers{first})"
    )


def _refuse(shape: EngineLayout, what: str, reason: str) -> ConfigError:
    return ConfigError("model", shape.model, f"{what}: {reason}")


def _check_parallel(shape: EngineLayout) -> None:
    if shape.pipeline_parallel > 1:
        raise _refuse(
            shape,
            f"pipeline_parallel_size={shape.pipeline_parallel}",
            "every rank must hold every layer for one plan to drive all ranks; "
            "use tensor parallelism",
        )
    if shape.rank_schedulers and shape.tensor_parallel > 1:
        raise _refuse(
            shape,
            f"tensor_parallel_size={shape.tensor_parallel} with a scheduler per rank "
            "(external_launcher)",
            "each rank's MiniFlex would decide its own hits, and a store or load that failed "
            "on one rank only would make the ranks' schedules diverge; use vLLM's mp or ray "
            "executor",
        )
    if shape.context_parallel > 1:
        raise _refuse(
            shape,
            f"context_parallel_size={shape.context_parallel}",
            "the ranks shard a block's tokens, and MiniFlex moves whole blocks",
        )


def geometry_for(
    shape: EngineLayout,
    kv_cache_config: Any,
    blocks_per_chunk: Callable[[int], int],
    hash_block_size: int | None = None,
) -> KVGeometry:
    """The chunk geometry of a model MiniFlex serves; a ConfigError naming why not.

    ``blocks_per_chunk`` maps vLLM's block size to the chunk length in blocks;
    ``hash_block_size``: vLLM's (0.32+) prefix-hash granularity (None: the block size).
    """
    _check_parallel(shape)
    groups = list(kv_cache_config.kv_cache_groups)
    if not groups:
        raise _refuse(shape, "no KV cache groups", "the model keeps no KV cache to offload")
    for i, group in enumerate(groups):
        reason = refusal_of_spec(group.kv_cache_spec)
        if reason is not None:
            raise _refuse(shape, _describe(group, i, len(groups)), reason)
    if len(groups) != 1:
        kinds = ", ".join(_describe(g, i, len(groups)) for i, g in enumerate(groups))
        raise _refuse(shape, kinds, "MiniFlex serves models whose layers form one KV cache group")
    spec = groups[0].kv_cache_spec
    if hash_block_size not in (None, spec.block_size):
        raise ConfigError(
            "hash_block_size",
            hash_block_size,
            f"must equal the block size {spec.block_size} for MiniFlex",
        )
    latent = type(spec).__name__ == "MLAAttentionSpec"
    return KVGeometry(
        num_layers=len(groups[0].layer_names),
        num_kv_heads=int(spec.num_kv_heads),
        head_size=int(spec.head_size),
        block_size=int(spec.block_size),
        dtype=str(spec.dtype).removeprefix("torch."),
        itemsize=int(spec.dtype.itemsize),
        blocks_per_chunk=blocks_per_chunk(int(spec.block_size)),
        latent=latent,
    )
