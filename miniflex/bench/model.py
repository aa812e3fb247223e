"""What the benchmarks need to know about a model: vocabulary, KV bytes per token.

Read from the model directory's ``config.json`` (no tokenizer, no weights), so
it works for the generated tiny model and for ``bench/models/qwen3-8b-shape``
alike. KV sizes come from :class:`miniflex.layout.KVGeometry`, the one place
that knows KV layouts.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from miniflex.errors import ConfigError
from miniflex.layout import KVGeometry

__all__ = ["ModelShape", "PromptMaker"]

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class ModelShape:
    """Sizes of one model, as vLLM will lay out its KV cache (full attention, one group)."""

    vocab_size: int
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_size: int | None = None
    dtype: str = "bfloat16"
    max_positions: int | None = None

    @classmethod
    def from_dir(cls, model: str | Path) -> ModelShape:
        path = Path(model) / "config.json"
        try:
            cfg = json.loads(path.read_text())
        except OSError as exc:
            raise ConfigError(
                "--model", str(model), f"a directory with a config.json ({exc})"
            ) from None
        heads = int(cfg["num_attention_heads"])
        dtype = str(cfg.get("torch_dtype") or "bfloat16")
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_kv_heads=int(cfg.get("num_key_value_heads", heads)),
            head_size=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            dtype=dtype if dtype in _DTYPE_BYTES else "bfloat16",
            max_positions=cfg.get("max_position_embeddings"),
        )

    @property
    def kv_bytes_per_token(self) -> int | None:
        """K and V bytes of one token over all layers (None: shape unknown)."""
        if self.num_layers is None or self.num_kv_heads is None or self.head_size is None:
            return None
        geometry = KVGeometry(
            num_layers=self.num_layers,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            block_size=1,
            dtype=self.dtype,
            itemsize=_DTYPE_BYTES[self.dtype],
            blocks_per_chunk=1,
        )
        return geometry.page_bytes * self.num_layers

    def kv_bytes(self, tokens: int) -> int | None:
        per_token = self.kv_bytes_per_token
        return None if per_token is None else tokens * per_token


class PromptMaker:
    """Deterministic token-id prompts; every ``(kind, *ids)`` gives its own prompt.

    Prompts of different keys share no prefix (their first tokens differ with
    overwhelming probability), so one never hits another's cached blocks.
    A fixed ``seed`` makes two runs, and the engines of one run, see the
    same prompts.
    """

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        margin = min(100, vocab_size // 20)
        self.lo, self.hi = margin, vocab_size - margin
        self.seed = seed

    def __call__(self, n: int, kind: str, *ids: object) -> list[int]:
        rng = random.Random(f"{self.seed}/{kind}/" + "/".join(map(str, ids)))
        return [rng.randrange(self.lo, self.hi) for _ in range(n)]
