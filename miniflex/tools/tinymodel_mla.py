"""A small DeepSeek-V2-shaped model with MLA and real random weights, generated locally.

Multi-head latent attention caches one latent vector per token and layer (one
KV "head" of ``kv_lora_rank + qk_rope_head_dim`` values, 512 + 64 as in
DeepSeek-V2/V3: the sizes vLLM's MLA kernels take), shared by every attention
head and replicated over tensor-parallel ranks. Every layer is dense (no
experts), so only the attention differs from :mod:`miniflex.tools.tinymodel`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["TinyMLASpec", "write_tiny_mla_model"]


@dataclass(frozen=True)
class TinyMLASpec:
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 32
    v_head_dim: int = 32
    vocab_size: int = 2048
    max_position_embeddings: int = 8192
    seed: int = 0
    weight_std: float = 0.08

    @property
    def latent_size(self) -> int:
        """Values cached per token and layer."""
        return self.kv_lora_rank + self.qk_rope_head_dim


def _config(spec: TinyMLASpec) -> dict:
    return {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "moe_intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_attention_heads,
        "kv_lora_rank": spec.kv_lora_rank,
        "q_lora_rank": None,
        "qk_rope_head_dim": spec.qk_rope_head_dim,
        "qk_nope_head_dim": spec.qk_nope_head_dim,
        "v_head_dim": spec.v_head_dim,
        "n_routed_experts": 2,  # unused: every layer is dense (first_k_dense_replace)
        "n_shared_experts": 1,
        "num_experts_per_tok": 1,
        "first_k_dense_replace": spec.num_hidden_layers,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "miniflex_spec": asdict(spec),
    }


def write_tiny_mla_model(path: str | Path, spec: TinyMLASpec = TinyMLASpec()) -> Path:
    """Write (or reuse, if the same spec is already there) the model at ``path``."""
    import torch
    from safetensors.torch import save_file

    path = Path(path)
    config = _config(spec)
    cfg_file = path / "config.json"
    if cfg_file.exists() and json.loads(cfg_file.read_text()) == config:
        return path
    path.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(spec.seed)
    h, n = spec.hidden_size, spec.num_attention_heads
    qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * spec.weight_std).to(torch.bfloat16)

    def ones(size: int) -> torch.Tensor:
        return torch.ones(size, dtype=torch.bfloat16)

    weights = {
        "model.embed_tokens.weight": rand(spec.vocab_size, h) * 10,
        "model.norm.weight": ones(h),
        "lm_head.weight": rand(spec.vocab_size, h),
    }
    for layer in range(spec.num_hidden_layers):
        p = f"model.layers.{layer}."
        weights |= {
            p + "self_attn.q_proj.weight": rand(n * qk, h),
            p + "self_attn.kv_a_proj_with_mqa.weight": rand(spec.latent_size, h),
            p + "self_attn.kv_a_layernorm.weight": ones(spec.kv_lora_rank),
            p + "self_attn.kv_b_proj.weight": rand(
                n * (spec.qk_nope_head_dim + spec.v_head_dim), spec.kv_lora_rank
            ),
            p + "self_attn.o_proj.weight": rand(h, n * spec.v_head_dim),
            p + "mlp.gate_proj.weight": rand(spec.intermediate_size, h),
            p + "mlp.up_proj.weight": rand(spec.intermediate_size, h),
            p + "mlp.down_proj.weight": rand(h, spec.intermediate_size),
            p + "input_layernorm.weight": ones(h),
            p + "post_attention_layernorm.weight": ones(h),
        }
    save_file({k: v.contiguous() for k, v in weights.items()}, str(path / "model.safetensors"))
    cfg_file.write_text(json.dumps(config, indent=1))
    return path
