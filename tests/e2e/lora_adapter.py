"""A random LoRA adapter (PEFT's files) for the tiny model, written locally."""

from __future__ import annotations

import json
from pathlib import Path

from miniflex.tools.tinymodel import TinyModelSpec

__all__ = ["write_lora"]


SPEC = TinyModelSpec()


def write_lora(path: Path, seed: int, rank: int = 8, spec: TinyModelSpec = SPEC) -> Path:
    """An adapter on every layer's q, k and v projections (k and v change the KV), with
    weights drawn from ``seed``; written over whatever ``path`` held."""
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    hidden, kv = spec.hidden_size, spec.num_key_value_heads * spec.head_dim
    tensors = {}
    for layer in range(spec.num_hidden_layers):
        for name, out in (("q_proj", hidden), ("k_proj", kv), ("v_proj", kv)):
            p = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            a = torch.randn(rank, hidden, generator=g) * 0.1
            tensors[p + ".lora_A.weight"] = a.to(torch.bfloat16)
            tensors[p + ".lora_B.weight"] = (torch.randn(out, rank, generator=g) * 0.1).bfloat16()
    save_file(tensors, str(path / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj"],
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "base_model_name_or_path": "tiny",
    }
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path
