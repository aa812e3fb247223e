"""What the benchmarks need to know about a model: vocabulary, KV bytes per token, prompts.

:class:`ModelShape` (``miniflex/model_shape.py``) reads the model directory's
``config.json`` (no tokenizer, no weights), so it works for the generated tiny
model and for ``bench/models/qwen3-8b-shape`` alike.
"""

from __future__ import annotations

import random

from miniflex.model_shape import ModelShape

__all__ = ["ModelShape", "PromptMaker"]


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
