"""A small Llama-architecture model with real random weights, generated locally.

vLLM needs a model directory; with no downloads, MiniFlex's demo and tests
write one: a ``config.json`` plus ``model.safetensors`` with seeded random
weights large enough that the KV cache visibly changes logprobs (wrong KV
gives different output, unlike ``load_format="dummy"``'s flat logits).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["TinyModelSpec", "write_tiny_model"]

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class TinyModelSpec:
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 2048
    max_position_embeddings: int = 8192
    seed: int = 0
    weight_std: float = 0.08
    layer_types: tuple[str, ...] = ()
    """Per layer ``"full_attention"`` or ``"sliding_attention"`` (empty: all full)."""
    sliding_window: int | None = None
    """Tokens a ``"sliding_attention"`` layer attends to."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def write_tiny_model(path: str | Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Write (or reuse, if the same spec is already there) the model at ``path``."""
    import torch
    from safetensors.torch import save_file

    path = Path(path)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "miniflex_spec": asdict(spec),
    }
    if spec.layer_types:
        assert len(spec.layer_types) == spec.num_hidden_layers, spec
        config |= {"layer_types": list(spec.layer_types), "sliding_window": spec.sliding_window}
    cfg_file = path / "config.json"
    if cfg_file.exists() and json.loads(cfg_file.read_text()) == config:
        return path
    path.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(spec.seed)
    h, i, d = spec.hidden_size, spec.intermediate_size, spec.head_dim

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * spec.weight_std).to(torch.bfloat16)

    weights = {
        "model.embed_tokens.weight": rand(spec.vocab_size, h) * 10,
        "model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
        "lm_head.weight": rand(spec.vocab_size, h),
    }
    for n in range(spec.num_hidden_layers):
        p = f"model.layers.{n}."
        weights |= {
            p + "self_attn.q_proj.weight": rand(spec.num_attention_heads * d, h),
            p + "self_attn.k_proj.weight": rand(spec.num_key_value_heads * d, h),
            p + "self_attn.v_proj.weight": rand(spec.num_key_value_heads * d, h),
            p + "self_attn.o_proj.weight": rand(h, spec.num_attention_heads * d),
            p + "mlp.gate_proj.weight": rand(i, h),
            p + "mlp.up_proj.weight": rand(i, h),
            p + "mlp.down_proj.weight": rand(h, i),
            p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        }
    save_file({k: v.contiguous() for k, v in weights.items()}, str(path / "model.safetensors"))
    cfg_file.write_text(json.dumps(config, indent=1))
    return path
