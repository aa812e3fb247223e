"""Scheduler-side state of one vLLM request, as MiniFlex tracks it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from miniflex.index import keys_to_array
from miniflex.plan import JobId, LoadTiming
from miniflex.remote.lookup import RemoteAnswer
from miniflex.scheduler.hits import Hit
from miniflex.tiers import ChunkSource
from miniflex.types import BlockId, ChunkKey, ReqId, Tier

__all__ = ["PendingLoad", "ReqState", "ScheduledReq", "load_tokens_by_tier"]


class ScheduledReq(NamedTuple):
    """A request scheduled this step, as vLLM's SchedulerOutput describes it (a tuple:
    one is built per running request per engine step)."""

    req_id: ReqId
    num_computed_tokens: int  # before this step
    num_scheduled_tokens: int
    block_ids: Sequence[BlockId]  # vLLM's list: read, never changed
    replace_blocks: bool  # True: block_ids is the whole table, else new blocks to append


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
    prompt_end: int | None = None
    """The prompt's length: the request's length at its first lookup, before any output.
    Chunks past it hold generated tokens, which MiniFlex stores at the lowest priority."""
    hit: Hit = field(default_factory=Hit)  # what the last lookup found
    decided: bool = False  # the cost model's decision was counted in stats
    ttft_start: float | None = None  # perf_counter at allocation, while its TTFT is measured
    load: PendingLoad | None = None
    load_job: JobId | None = None
    load_job_sync: bool = False  # load_job runs inside a step's forward (vLLM doesn't wait)
    loaded_as: LoadTiming | None = None  # how its last load ran (None: never loaded)
    stored_chunks: int = 0  # leading chunks already stored, present or skipped
    store_due: int = 0  # leading chunks computed, to be stored
    store_waits_since: float | None = None
    """When the chunk at ``stored_chunks`` began waiting for a CPU slot (None: none waits)."""
    store_jobs: set[JobId] = field(default_factory=set)
    finished: bool = False
    hit_tokens: int = 0
    hit_by_tier: dict[str, int] = field(default_factory=dict)  # tier name -> tokens loaded
    landing_since: float | None = None
    """When lookups began waiting for a chunk on its way to SSD (None: not waiting)."""
    stored_tokens: int = 0
    loaded_spans: list[tuple[int, tuple[Tier, ...]]] = field(default_factory=list)
    """Each load's first block and the tier of each block it served (the request's trace)."""
    failed_chunks: set[int] = field(default_factory=set)  # chunks whose read failed
    ttft_measured_s: float | None = None  # the TTFT measured beside its decision's prediction
    gpu_hit_tokens: int | None = None  # vLLM's own hit when first admitted (the trace)
    remote_answer: RemoteAnswer | None = None
    """The remote store's last answer for this request's keys (reused while fresh)."""

    def prompt_chunks(self, chunk_tokens: int) -> int:
        """How many leading chunks hold prompt tokens only (the rest hold output too)."""
        end = self.prompt_end if self.prompt_end is not None else self.num_prompt_tokens
        return end // chunk_tokens

    @property
    def store_waits(self) -> bool:
        """Chunks computed and not stored yet wait for a CPU slot (see
        :class:`~miniflex.scheduler.store_planner.StorePlanner`)."""
        return self.store_waits_since is not None and self.store_due > self.stored_chunks

    def credit(self, served: Mapping[str, int]) -> None:
        """Add a finished load's tokens per tier (``served_by_tier``) to the request's hits."""
        self.hit_tokens += sum(served.values())
        for tier, n in served.items():
            self.hit_by_tier[tier] = self.hit_by_tier.get(tier, 0) + n

    def finished_params(self) -> dict[str, dict[str, object]]:
        """What ``request_finished`` returns as the request's ``kv_transfer_params``: its hit
        in tokens, by tier, and what each tier held of it at its last lookup."""
        return {
            "miniflex": {
                "hit_tokens": self.hit_tokens,
                "stored_tokens": self.stored_tokens,
                **{f"hit_tokens_{tier}": n for tier, n in self.hit_by_tier.items()},
                **{f"resident_tokens_{t}": n for t, n in self.hit.resident_by_tier.items()},
                **({"load": self.loaded_as.value} if self.loaded_as is not None else {}),
            }
        }

    @property
    def busy(self) -> bool:
        """True while MiniFlex still moves bytes of this request's blocks, or will."""
        return self.load_job is not None or bool(self.store_jobs) or self.store_waits


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
