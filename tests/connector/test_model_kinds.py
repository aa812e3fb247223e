"""Every model kind MiniFlex cannot serve is refused when its connector is built, in one line.

Each case hands MiniFlex's connector, in both roles, the KV cache config vLLM
would build for such a model (vLLM's own spec classes) and checks the refusal
names the model, the spec and the reason. A spec class this vLLM version lacks
skips its case.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1 import kv_cache_interface as kci

from miniflex.connector import MiniFlexConnector
from miniflex.errors import ConfigError
from tests.connector.engine_config import (
    BLOCK,
    HEAD,
    HEADS,
    full_attention,
    make_kv_cache_config,
    make_vllm_config,
    write_model_config,
)

ATTN = {"block_size": BLOCK, "num_kv_heads": HEADS, "head_size": HEAD, "dtype": torch.float16}
LAYERS_A, LAYERS_B = ["model.layers.0.attn", "model.layers.2.attn"], ["model.layers.1.attn"]


def spec(name: str, **kwargs: Any) -> Any:
    """vLLM's spec class ``name`` built with ``kwargs``; skips where this version differs."""
    cls = getattr(kci, name, None)
    if cls is None:
        pytest.skip(f"this vLLM has no {name}")
    try:
        return cls(**kwargs)
    except TypeError as exc:
        pytest.skip(f"this vLLM's {name} takes other fields: {exc}")


def build(tmp_path: Path, groups: list, role: KVConnectorRole, **parallel: int) -> Any:
    model = write_model_config(tmp_path / "model")
    vc = make_vllm_config(model, {"cpu_bytes": "1MiB", "blocks_per_chunk": 2})
    for key, value in parallel.items():
        setattr(vc.parallel_config, key, value)
    return MiniFlexConnector(vc, role, make_kv_cache_config(64, groups))


@dataclass(frozen=True)
class Case:
    groups: Any  # () -> [(layer names, spec), ...]
    says: tuple[str, ...]  # what the message names besides the model


def mamba() -> Any:
    return spec("MambaSpec", block_size=BLOCK, shapes=((4, 8),), dtypes=(torch.float16,))


def mla(**kwargs: Any) -> Any:
    return spec(
        "MLAAttentionSpec",
        block_size=BLOCK,
        num_kv_heads=1,
        head_size=32,
        dtype=torch.float16,
        **kwargs,
    )


CASES = {
    "mamba_hybrid": Case(
        lambda: [(LAYERS_A, full_attention()), (LAYERS_B, mamba())],
        ("MambaSpec", "group 1 of 2", "running state", "chunk boundaries"),
    ),
    "sliding_window_group": Case(
        lambda: [(LAYERS_A, spec("SlidingWindowSpec", **ATTN, sliding_window=64))],
        ("SlidingWindowSpec", "frees the blocks"),
    ),
    "chunked_local_group": Case(
        lambda: [(LAYERS_A, spec("ChunkedLocalAttentionSpec", **ATTN, attention_chunk_size=64))],
        ("ChunkedLocalAttentionSpec", "frees the blocks"),
    ),
    "cross_attention": Case(
        lambda: [(LAYERS_A, full_attention()), (LAYERS_B, spec("CrossAttentionSpec", **ATTN))],
        ("CrossAttentionSpec", "encoder input"),
    ),
    "encoder_only": Case(
        lambda: [(LAYERS_A, spec("EncoderOnlyAttentionSpec", **ATTN))],
        ("EncoderOnlyAttentionSpec", "no KV cache between requests"),
    ),
    "attention_sinks": Case(
        lambda: [(LAYERS_A, spec("SinkFullAttentionSpec", **ATTN, sink_len=4))],
        ("SinkFullAttentionSpec", "sinks"),
    ),
    "bidirectional": Case(
        lambda: [(LAYERS_A, spec("FullAttentionSpec", **ATTN, non_causal=True))],
        ("FullAttentionSpec", "bidirectionally"),
    ),
    "kv_quant_per_token_scales": Case(
        lambda: [(LAYERS_A, spec("FullAttentionSpec", **ATTN, kv_quant_mode=kci.KVQuantMode(2)))],
        ("FullAttentionSpec", "INT8_PER_TOKEN_HEAD"),
    ),
    "uneven_k_v_heads": Case(
        lambda: [(LAYERS_A, spec("FullAttentionSpec", **ATTN, head_size_v=2 * HEAD))],
        ("FullAttentionSpec", "K and V head sizes differ"),
    ),
    "mla_with_scales_in_its_pages": Case(
        lambda: [(LAYERS_A, mla(cache_dtype_str="fp8_ds_mla"))],
        ("MLAAttentionSpec", "fp8_ds_mla", "packs scales"),
    ),
    "sparse_mla": Case(
        lambda: [(LAYERS_A, mla(model_version="deepseek_v4"))],
        ("MLAAttentionSpec", "deepseek_v4", "indexer"),
    ),
    "unknown_spec": Case(
        lambda: [(LAYERS_A, MysterySpec(**ATTN))],
        ("MysterySpec", "does not know"),
    ),
}


@dataclass(frozen=True)
class MysterySpec(kci.FullAttentionSpec):
    """A spec some future vLLM adds: full attention by inheritance, unknown pages."""


@pytest.mark.parametrize("role", [KVConnectorRole.WORKER, KVConnectorRole.SCHEDULER])
@pytest.mark.parametrize("kind", sorted(CASES))
def test_unsupported_kv_cache_spec_is_refused_in_one_line(
    tmp_path: Path, kind: str, role: KVConnectorRole
) -> None:
    case = CASES[kind]
    with pytest.raises(ConfigError) as err:
        build(tmp_path, case.groups(), role)
    message = str(err.value)
    assert "\n" not in message
    assert f"model='{tmp_path / 'model'}'" in message
    for fragment in case.says:
        assert fragment in message, message


def test_two_full_attention_groups_are_refused(tmp_path: Path) -> None:
    other = spec("FullAttentionSpec", **{**ATTN, "head_size": 2 * HEAD})
    with pytest.raises(ConfigError, match="one KV cache group"):
        build(tmp_path, [(LAYERS_A, full_attention()), (LAYERS_B, other)], KVConnectorRole.WORKER)


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        ("pipeline_parallel_size", 2, "pipeline_parallel_size=2"),
        ("decode_context_parallel_size", 2, "context_parallel_size=2"),
    ],
)
def test_parallel_layouts_whose_ranks_hold_other_layers_or_tokens_are_refused(
    tmp_path: Path, setting: str, value: int, says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        build(tmp_path, None, KVConnectorRole.SCHEDULER, **{setting: value})


def test_tensor_parallel_ranks_that_schedule_on_their_own_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="external_launcher"):
        build(
            tmp_path,
            None,
            KVConnectorRole.SCHEDULER,
            tensor_parallel_size=2,
            distributed_executor_backend="external_launcher",
        )


def test_sliding_window_layers_promoted_to_full_attention_are_served(tmp_path: Path) -> None:
    """vLLM's hybrid KV cache manager off: every block of every layer is kept, so every
    page MiniFlex stores stays live (the window only limits what attention reads)."""
    promoted = spec("FullAttentionSpec", **ATTN, sliding_window=64)
    conn = build(tmp_path, [(LAYERS_A, promoted)], KVConnectorRole.SCHEDULER)
    assert conn.geometry.num_layers == len(LAYERS_A)
