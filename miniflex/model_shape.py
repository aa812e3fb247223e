"""What MiniFlex can know of a model before vLLM loads it: its ``config.json``.

The benchmarks size prompts and tiers from it, and ``miniflex serve`` checks
that the CPU tier holds a chunk of the model before vLLM starts. No tokenizer
and no weights are read. KV sizes come from :class:`miniflex.layout.KVGeometry`,
the one place that knows KV layouts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from miniflex.errors import ConfigError
from miniflex.layout import KVGeometry

__all__ = ["DTYPE_BYTES", "MLA_MODEL_TYPES", "ModelShape", "runs_as_mla"]

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

MLA_MODEL_TYPES = frozenset(
    {
        "axk1",
        "bailing_hybrid",
        "bailing_hybrid_mtp",
        "deepseek_mtp",
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v32",
        "glm4_moe_lite",
        "glm4_moe_lite_mtp",
        "glm_moe_dsa",
        "kimi_k2",
        "kimi_linear",
        "longcat_flash",
        "longcat_flash_ngram",
        "pangu_ultra_moe",
        "pangu_ultra_moe_mtp",
    }
)
"""Model types vLLM runs with a latent (MLA) cache when their config has ``kv_lora_rank``
(vLLM's ``is_deepseek_mla``); any other model, MiniCPM3's among them, caches K and V."""


def runs_as_mla(cfg: dict) -> bool:
    """Whether vLLM caches this text config's KV as one latent vector (MLA): a model type it
    runs so, with ``kv_lora_rank``, unless ``VLLM_MLA_DISABLE`` is set (then K and V)."""
    if os.environ.get("VLLM_MLA_DISABLE", "0") not in ("", "0"):
        return False
    return cfg.get("model_type") in MLA_MODEL_TYPES and cfg.get("kv_lora_rank") is not None


@dataclass(frozen=True)
class ModelShape:
    """Sizes of one model, as vLLM will lay out its KV cache (full attention, one group)."""

    vocab_size: int
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_size: int | None = None
    dtype: str = "bfloat16"
    max_positions: int | None = None
    latent: bool = False
    """MLA (:func:`runs_as_mla`): one latent vector of ``kv_lora_rank + qk_rope_head_dim``
    values per token and layer, the same on every TP rank."""

    @classmethod
    def from_dir(cls, model: str | Path, key: str = "--model") -> ModelShape:
        """Read ``model/config.json``; ConfigError naming ``key`` when it cannot be read."""
        path = Path(model) / "config.json"
        try:
            cfg = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(key, str(model), f"a directory with a config.json ({exc})") from None
        return cls.from_config(cfg)

    @classmethod
    def from_config(cls, cfg: dict) -> ModelShape:
        """From a parsed ``config.json`` (a multimodal model's ``text_config`` if it has one)."""
        cfg = cfg.get("text_config") or cfg
        heads = int(cfg["num_attention_heads"])
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        latent = runs_as_mla(cfg)
        if latent:
            kv_heads, head_size = 1, int(cfg["kv_lora_rank"]) + int(cfg["qk_rope_head_dim"])
        else:
            kv_heads = int(cfg.get("num_key_value_heads") or heads)
            head_size = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_kv_heads=kv_heads,
            head_size=head_size,
            dtype=dtype if dtype in DTYPE_BYTES else "bfloat16",
            max_positions=cfg.get("max_position_embeddings"),
            latent=latent,
        )

    def geometry(
        self, block_size: int, blocks_per_chunk: int, itemsize: int | None = None, tp_size: int = 1
    ) -> KVGeometry | None:
        """One TP rank's KV geometry (vLLM splits KV heads over ranks, at least one each; a
        latent cache is whole on every rank); None while the shape is unknown. ``itemsize``:
        the KV cache's, else the model's."""
        if self.num_layers is None or self.num_kv_heads is None or self.head_size is None:
            return None
        return KVGeometry(
            num_layers=self.num_layers,
            num_kv_heads=max(1, self.num_kv_heads // tp_size),
            head_size=self.head_size,
            block_size=block_size,
            dtype=self.dtype,
            itemsize=itemsize or DTYPE_BYTES[self.dtype],
            blocks_per_chunk=blocks_per_chunk,
            latent=self.latent,
        )

    @property
    def kv_bytes_per_token(self) -> int | None:
        """KV bytes of one token over all layers (None: shape unknown)."""
        geometry = self.geometry(block_size=1, blocks_per_chunk=1)
        return None if geometry is None else geometry.page_bytes * geometry.num_layers

    def kv_bytes(self, tokens: int) -> int | None:
        per_token = self.kv_bytes_per_token
        return None if per_token is None else tokens * per_token
