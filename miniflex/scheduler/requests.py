"""Scheduler-side state of one vLLM request, as MiniFlex tracks it."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from miniflex.plan import JobId, LoadTiming
from miniflex.remote.lookup import RemoteAnswer
from miniflex.scheduler.chunk_keys import ChunkKeys
from miniflex.scheduler.hits import Hit
from miniflex.tiers import ChunkSource
from miniflex.types import BlockId, ChunkKey, ReqId, Tier

__all__ = ["PendingLoad", "ReqAccount", "ReqState", "ScheduledReq", "load_tokens_by_tier"]


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
class ReqAccount:
    """What a request was served and how long it took: its ``kv_transfer_params``, its trace
    and its TTFT against the cost model's prediction. Invariant: ``hit_tokens`` is the sum
    of ``hit_by_tier``."""

    hit_tokens: int = 0
    hit_by_tier: dict[str, int] = field(default_factory=dict)  # tier name -> tokens loaded
    stored_tokens: int = 0
    loaded_as: LoadTiming | None = None  # how its last load ran (None: never loaded)
    loaded_spans: list[tuple[int, tuple[Tier, ...]]] = field(default_factory=list)
    """Each load's first block and the tier of each block it served (the request's trace)."""
    loaded_below_cpu: set[ChunkKey] = field(default_factory=set)
    """The chunks this request loaded from SSD or the remote store (any block of them),
    by key: held there, so storing them again would only evict the CPU tier's copy of
    their prefix (a load streams a prompt longer than the CPU tier). A key vLLM's rewrite
    of the prompt's tail replaced is not among them: that chunk is stored anew."""
    gpu_hit_tokens: int | None = None  # vLLM's own hit when first admitted (the trace)
    decided: bool = False  # the cost model's decision was counted in stats
    ttft_start: float | None = None  # perf_counter at allocation, while its TTFT is measured
    ttft_measured_s: float | None = None  # the TTFT measured beside its decision's prediction
    looked_up_at: float | None = None  # perf_counter at its first lookup since allocation
    load_seconds: dict[str, float] = field(default_factory=dict)
    """Its last asynchronous load: ``queued`` (from its first lookup to vLLM allocating its
    blocks: its wait for KV space; while backfill passes over it, it is not looked up, and
    that wait is not counted), then, on the slowest rank, once every rank's load
    succeeded: ``wall`` (from the plan reaching the worker to the report),
    ``wait`` (of that, before a lane started it: waits for the put copies and write-backs
    of its slots, and for its lane), and the time its SSD reads, remote fetches and GPU
    copies took (``ssd``, ``remote``, ``copy``: lanes may overlap)."""

    def start_load(self, timing: LoadTiming, looked_up_at: float | None) -> None:
        """A load of ``timing`` was planned now, for blocks allocated after a lookup at
        ``looked_up_at``: its times start over (see ``load_seconds``)."""
        self.loaded_as, self.load_seconds = timing, {}
        if timing is LoadTiming.ASYNC and looked_up_at is not None:
            self.load_seconds["queued"] = time.perf_counter() - looked_up_at

    def credit(self, served: Mapping[str, int]) -> None:
        """Add a finished load's tokens per tier (``served_by_tier``) to the request's hits."""
        self.hit_tokens += sum(served.values())
        for tier, n in served.items():
            self.hit_by_tier[tier] = self.hit_by_tier.get(tier, 0) + n

    def check(self) -> None:
        assert self.hit_tokens == sum(self.hit_by_tier.values()), (
            f"hit {self.hit_tokens} tokens, by tier {self.hit_by_tier}"
        )


@dataclass
class ReqState:
    """What the scheduler half knows about one request (never crosses processes).

    Four parts: its chunk keys; its progress (vLLM's hit and length at the last lookup,
    the chunks computed and stored); its transfers (at most one load, pending or sent, and
    its store jobs); and its account (``ReqAccount``). ``check`` asserts the invariant."""

    req_id: ReqId
    keys: ChunkKeys = field(default_factory=ChunkKeys)
    block_ids: list[BlockId] = field(default_factory=list)
    # progress
    num_computed_tokens: int = 0  # vLLM's hit at the last lookup
    num_prompt_tokens: int = 0  # the request's length at the last lookup
    prompt_end: int | None = None
    """The prompt's length: the request's length at its first lookup, before any output.
    Chunks past it hold generated tokens, which MiniFlex stores at the lowest priority."""
    hit: Hit = field(default_factory=Hit)  # what the last lookup found
    landing_since: float | None = None
    """When lookups began waiting for a chunk on its way to SSD (None: not waiting)."""
    remote_answer: RemoteAnswer | None = None
    """The remote store's last answer for this request's keys (reused while fresh)."""
    stored_chunks: int = 0  # leading chunks already stored, present or skipped
    store_due: int = 0  # leading chunks computed, to be stored
    store_waits_since: float | None = None
    """When the chunk at ``stored_chunks`` began waiting for a CPU slot (None: none waits)."""
    finished: bool = False
    # transfers
    load: PendingLoad | None = None  # decided, not sent yet
    load_job: JobId | None = None  # sent, not committed yet
    load_job_sync: bool = False  # load_job runs inside a step's forward (vLLM doesn't wait)
    store_jobs: set[JobId] = field(default_factory=set)
    failed_chunks: set[int] = field(default_factory=set)  # chunks whose read failed
    account: ReqAccount = field(default_factory=ReqAccount)

    def prompt_chunks(self, chunk_tokens: int) -> int:
        """How many leading chunks hold prompt tokens only (the rest hold output too)."""
        end = self.prompt_end if self.prompt_end is not None else self.num_prompt_tokens
        return end // chunk_tokens

    @property
    def store_waits(self) -> bool:
        """Chunks computed and not stored yet wait for a CPU slot (see
        :class:`~miniflex.scheduler.store_planner.StorePlanner`)."""
        return self.store_waits_since is not None and self.store_due > self.stored_chunks

    def finished_params(self) -> dict[str, dict[str, object]]:
        """What ``request_finished`` returns as the request's ``kv_transfer_params``: its hit
        in tokens, by tier, what each tier held of it at its last lookup, what of that the
        cost model chose to recompute (where it did), and its last asynchronous load's times
        (``load_queued_s``, ``load_wall_s``, ``load_wait_s``, ``load_ssd_s``,
        ``load_remote_s``, ``load_copy_s``)."""
        a = self.account
        return {
            "miniflex": {
                "hit_tokens": a.hit_tokens,
                "stored_tokens": a.stored_tokens,
                **{f"hit_tokens_{tier}": n for tier, n in a.hit_by_tier.items()},
                **{f"resident_tokens_{t}": n for t, n in self.hit.resident_by_tier.items()},
                **({"declined_tokens": d} if (d := self.hit.declined_tokens) else {}),
                **({"load": a.loaded_as.value} if a.loaded_as is not None else {}),
                **{f"load_{k}_s": round(v, 4) for k, v in a.load_seconds.items()},
            }
        }

    @property
    def busy(self) -> bool:
        """True while MiniFlex still moves bytes of this request's blocks, or will."""
        return self.load_job is not None or bool(self.store_jobs) or self.store_waits

    def check(self) -> None:
        """Assert the invariant: consistent keys; at most one load, pending or sent; a load
        inside a step only as a sent load; a consistent account."""
        self.keys.check()
        assert self.load is None or self.load_job is None, f"{self.req_id}: two loads"
        assert self.load_job is not None or not self.load_job_sync, f"{self.req_id}: sync of none"
        self.account.check()


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
