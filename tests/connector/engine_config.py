"""The vLLM configs the flow tests run under: a tiny Llama-shaped model, scheduler, connector.

Nothing here starts an engine: the configs are what vLLM would build, handed to
its real ``Scheduler`` and to MiniFlex's two halves in one process.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput

BLOCK, HEADS, HEAD, LAYERS = 16, 2, 8, 2
LATENT = 32
"""Values of an MLA layer's latent vector per token (DeepSeek's are 512 + 64)."""


def page_shape(mla: bool) -> tuple[int, int, int]:
    """``(heads, block_size, values)`` of one page: K|V per KV head, or one latent head."""
    return (1, BLOCK, LATENT) if mla else (HEADS, BLOCK, 2 * HEAD)


def write_model_config(model_dir: Path, **overrides: Any) -> Path:
    """A Llama-shaped ``config.json`` (no weights: nothing here runs the model)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "head_dim": HEAD,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "torch_dtype": "float16",
        **overrides,
    }
    (model_dir / "config.json").write_text(json.dumps(config))
    return model_dir


def make_vllm_config(
    model_dir: Path,
    extra: dict[str, Any],
    num_blocks: int = 64,
    max_batched: int = 512,
    connector: str = "MiniFlexConnector",
) -> VllmConfig:
    """vLLM's config with MiniFlex as its connector; ``extra`` is its extra config.
    ``connector``: the class vLLM loads (``MiniFlexHMAConnector`` keeps the hybrid KV
    cache manager on)."""
    mc = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="float16", seed=0)
    sc = SchedulerConfig(
        max_num_seqs=8,
        max_num_batched_tokens=max_batched,
        max_model_len=2048,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    kt = KVTransferConfig(
        kv_connector=connector,
        kv_connector_module_path="miniflex.connector",
        kv_role="kv_both",
        kv_connector_extra_config=extra,
    )
    vc = VllmConfig(
        model_config=mc,
        scheduler_config=sc,
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
        kv_transfer_config=kt,
        device_config=DeviceConfig("cpu"),
    )
    vc.cache_config.num_gpu_blocks = num_blocks
    return vc


def full_attention() -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float16
    )


def mla_attention() -> Any:
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    return MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=LATENT, dtype=torch.float16)


def make_kv_cache_config(
    num_blocks: int, groups: Sequence[tuple[Sequence[str], Any]] | None = None
) -> KVCacheConfig:
    """vLLM's KV cache config: one full-attention group of ``LAYERS`` layers unless
    ``groups`` (``(layer names, spec)`` each) says otherwise."""
    if groups is None:
        groups = [([f"layer{i}" for i in range(LAYERS)], full_attention())]
    kcc = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(list(names), spec) for names, spec in groups],
    )
    kcc.kv_cache_layout = "LBHNC"
    return kcc


def capture_graphs(vc: VllmConfig, mode: str) -> None:
    """Configure CUDA graphs as vLLM does on a GPU (the CPU backend turns them off), before
    the scheduler and so its connector are built: batches of up to 16 tokens captured."""
    from vllm.config import CompilationMode, CUDAGraphMode

    cc = vc.compilation_config
    cc.mode = CompilationMode.VLLM_COMPILE
    cc.splitting_ops = list(cc._attention_ops)  # attention runs between piecewise graphs
    cc.use_inductor_graph_partition = False
    cc.cudagraph_mode = CUDAGraphMode[mode]
    cc.cudagraph_capture_sizes = [1, 2, 4, 8, 16]
    cc.max_cudagraph_capture_size = 16


def tokens(seed: int, n: int) -> list[int]:
    """A deterministic prompt of ``n`` token ids (``seed`` picks which)."""
    return [(seed * 7919 + i * 104729) % 997 + 3 for i in range(n)]


def runner_output(
    ids: list[str], sampled: list[list[int]] | None = None, kv: Any = None
) -> ModelRunnerOutput:
    """vLLM's ``ModelRunnerOutput`` for requests ``ids`` (in order), with their sampled tokens
    and the workers' connector output; ``req_id_to_index`` where this vLLM still has it
    (0.26-0.33)."""
    index = {r: i for i, r in enumerate(ids)}
    extra = {"req_id_to_index": index} if "req_id_to_index" in _RUNNER_FIELDS else {}
    return ModelRunnerOutput(
        req_ids=ids, sampled_token_ids=sampled or [], kv_connector_output=kv, **extra
    )


_RUNNER_FIELDS = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
