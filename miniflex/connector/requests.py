"""Scheduler-side state of one vLLM request, as MiniFlex tracks it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from miniflex.cost import Decision
from miniflex.index import keys_to_array
from miniflex.plan import JobId, LoadTiming
from miniflex.tiers import ChunkSource
from miniflex.types import BlockId, ChunkKey, ReqId, Tier

__all__ = ["PendingLoad", "ReqState", "load_tokens_by_tier", "tokens_by_tier"]


@dataclass
class PendingLoad:
    """A load decided in ``update_state_after_alloc``, sent with the next plan."""

    first_token: int  # vLLM's own hit: the load starts here
    num_tokens: int  # tokens MiniFlex promised to vLLM
    sources: list[ChunkSource]  # pinned, one per chunk from the load's first chunk on
    timing: LoadTiming = LoadTiming.ASYNC


@dataclass
class ReqState:
    """What the scheduler half knows about one request (never crosses processes)."""

    req_id: ReqId
    keys: list[ChunkKey] = field(default_factory=list)
    key_array: np.ndarray = field(default_factory=lambda: keys_to_array([]))
    """``keys`` as the (n, 2) uint64 array the index matches in one compiled call."""
    key_sources: list[bytes] = field(default_factory=list)
    """vLLM's block hash each key was derived from (the chunk's last block)."""
    block_ids: list[BlockId] = field(default_factory=list)
    num_computed_tokens: int = 0  # vLLM's hit at the last lookup
    num_prompt_tokens: int = 0  # the request's length at the last lookup
    decision: Decision | None = None  # the cost model's, at the last lookup
    decided: bool = False  # the decision was counted in stats
    timing: LoadTiming = LoadTiming.ASYNC  # how the hit of the last lookup would load
    ttft_start: float | None = None  # perf_counter at allocation, while its TTFT is measured
    load: PendingLoad | None = None
    load_job: JobId | None = None
    load_job_sync: bool = False  # load_job runs inside a step's forward (vLLM doesn't wait)
    loaded_as: LoadTiming | None = None  # how its last load ran (None: never loaded)
    stored_chunks: int = 0  # leading chunks already stored, present or skipped
    store_jobs: set[JobId] = field(default_factory=set)
    finished: bool = False
    hit_tokens: int = 0
    hit_by_tier: dict[str, int] = field(default_factory=dict)  # tier name -> tokens loaded
    landing_since: float | None = None
    """When lookups began waiting for a chunk on its way to SSD (None: not waiting)."""
    resident_by_tier: dict[str, int] = field(default_factory=dict)
    """Tier name -> prompt tokens the last lookup found there (before the cost model chose)."""
    stored_tokens: int = 0

    @property
    def busy(self) -> bool:
        """True while MiniFlex still moves bytes of this request's blocks."""
        return self.load_job is not None or bool(self.store_jobs)


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
