"""Per-tier hit accounting, in one place: what a lookup found, and which tier served what.

A request's hit is counted in tokens per tier name (``"cpu"``, ``"ssd"``):

- :class:`Hit`, the frozen answer of one lookup: how many tokens to load, how, and what
  each tier held before the cost model chose (``resident_tokens_*``);
- :func:`load_tokens_by_tier`: a promised load split by source tier (vLLM 0.32+'s
  ``get_external_cache_hit_sources``);
- :func:`served_by_tier` and :func:`credit`: the blocks a finished load delivered, added to
  the request (``hit_tokens_*``); the engine-wide tally is ``TransferStats.hit_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from miniflex.cost import Decision
from miniflex.plan import LoadTiming
from miniflex.types import Tier

if TYPE_CHECKING:
    from miniflex.scheduler.requests import PendingLoad, ReqState

__all__ = ["Hit", "credit", "load_tokens_by_tier", "served_by_tier", "tokens_by_tier"]


@dataclass(frozen=True)
class Hit:
    """What one lookup (``get_num_new_matched_tokens``) found for a request.

    ``tokens``: tokens beyond vLLM's own hit that MiniFlex will load; None: not known
    yet (a chunk is landing on SSD), vLLM asks again in a later step. ``timing``: how
    they load (ASYNC: before the step that computes the rest; else inside it).
    ``decision``: the cost model's, when it decided. ``resident_by_tier``: tier name ->
    prompt tokens found resident there, before the cost model chose what to load.
    """

    tokens: int | None = 0
    timing: LoadTiming = LoadTiming.ASYNC
    decision: Decision | None = None
    resident_by_tier: Mapping[str, int] = field(default_factory=dict)

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


def load_tokens_by_tier(
    load: PendingLoad | None, num_tokens: int, chunk_tokens: int
) -> dict[Tier | None, int]:
    """``num_tokens`` of a load promised to vLLM, split by the tier each token is read from.

    The load starts at ``load.first_token`` (vLLM's own hit, which may fall inside a
    chunk); ``load.sources[i]`` says where its i-th chunk comes from. Tokens of chunks
    it holds no source for (no longer resident when it was pinned: they become load
    errors and are recomputed), or of no load at all, count under ``None``. The counts
    sum to ``num_tokens``; zero counts are left out. Example, 32-token chunks, a load of
    80 tokens from token 16 whose chunks are CPU, SSD, CPU::

        tokens 16-31 -> CPU, 32-63 -> SSD, 64-95 -> CPU  ==  {CPU: 48, SSD: 32}
    """
    out: dict[Tier | None, int] = {}
    first = load.first_token if load is not None else 0
    sources = load.sources if load is not None else []
    c0, end = first // chunk_tokens, first + num_tokens
    for i, src in enumerate(sources):
        lo, hi = max(first, (c0 + i) * chunk_tokens), min(end, (c0 + i + 1) * chunk_tokens)
        if hi <= lo:
            break
        out[src.tier] = out.get(src.tier, 0) + hi - lo
    rest = num_tokens - sum(out.values())
    if rest > 0:
        out[None] = rest
    return out


def served_by_tier(block_tiers: Sequence[Tier], block_size: int) -> dict[str, int]:
    """Tier name -> tokens of the loaded blocks, ``block_tiers`` giving each block's tier."""
    served: dict[str, int] = {}
    for tier in block_tiers:
        name = tier.name.lower()
        served[name] = served.get(name, 0) + block_size
    return served


def credit(st: ReqState, served: Mapping[str, int]) -> None:
    """Add a finished load's tokens per tier to the request's hits."""
    st.hit_tokens += sum(served.values())
    for tier, n in served.items():
        st.hit_by_tier[tier] = st.hit_by_tier.get(tier, 0) + n
