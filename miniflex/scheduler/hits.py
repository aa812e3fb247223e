"""Per-tier hit accounting, in one place: what a lookup found, and which tier served what.

A request's hit is counted in tokens per tier name (``"cpu"``, ``"ssd"``):

- :class:`Hit`, the frozen answer of one lookup: how many tokens to load, how, and what
  each tier held before the cost model chose (``resident_tokens_*``);
- :func:`served_by_tier`: the blocks a finished load delivered, by tier, which
  :meth:`~miniflex.scheduler.requests.ReqState.credit` adds to the request
  (``hit_tokens_*``); the engine-wide tally is ``TransferStats.hit_tokens``;
- a promised load split by source tier is
  :func:`~miniflex.scheduler.requests.load_tokens_by_tier` (beside the load it reads).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from miniflex.cost import Decision
from miniflex.plan import LoadTiming
from miniflex.types import Tier

__all__ = ["Hit", "served_by_tier", "tokens_by_tier"]


@dataclass(frozen=True)
class Hit:
    """What one lookup (``get_num_new_matched_tokens``) found for a request.

    ``tokens``: tokens beyond vLLM's own hit that MiniFlex will load; None: not known
    yet (a chunk is landing on SSD), vLLM asks again in a later step. ``timing``: how
    they load (ASYNC: before the step that computes the rest; else inside it).
    ``decision``: the cost model's, when it decided. ``resident_by_tier``: tier name ->
    prompt tokens found resident there, before the cost model chose what to load.
    ``declined_tokens``: tokens vLLM could have taken of the resident chunks offered to
    the cost model that it chose to recompute instead.
    """

    tokens: int | None = 0
    timing: LoadTiming = LoadTiming.ASYNC
    decision: Decision | None = None
    resident_by_tier: Mapping[str, int] = field(default_factory=dict)
    declined_tokens: int = 0

    @property
    def load_async(self) -> bool:
        """vLLM's ``load_kv_async``: False loads inside the step that computes the rest."""
        return self.timing is LoadTiming.ASYNC


def tokens_by_tier(
    tiers: Sequence[Tier], first_token: int, num_tokens: int, chunk_tokens: int
) -> dict[str, int]:
    """Tier name -> prompt tokens of the consecutive chunks ``tiers`` (the first starting at
    ``first_token``); the last chunk counts only up to the prompt's end, ``num_tokens``."""
    out: dict[str, int] = {}
    for i, tier in enumerate(tiers):
        n = min(chunk_tokens, num_tokens - first_token - i * chunk_tokens)
        if n <= 0:
            break
        out[tier.name.lower()] = out.get(tier.name.lower(), 0) + n
    return out


def served_by_tier(block_tiers: Sequence[Tier], block_size: int) -> dict[str, int]:
    """Tier name -> tokens of the loaded blocks, ``block_tiers`` giving each block's tier."""
    served: dict[str, int] = {}
    for tier in block_tiers:
        name = tier.name.lower()
        served[name] = served.get(name, 0) + block_size
    return served
