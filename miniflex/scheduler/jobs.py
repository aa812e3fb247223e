"""The jobs the scheduler has sent, one record type per kind, each with its own commit.

Every TP rank reports every job. A record collects the reports
(:meth:`JobRecord.report`) and, once the last one is in, commits or rolls back
what the job prepared (:meth:`JobRecord.commit`, the second phase of the
tiers' two-phase ``prepare_*``/``complete_*``):

- :class:`LoadRecord`: unpins the chunks it loaded, publishes the ones it promoted
  from SSD or fetched from the remote store, drops the ones that failed, and
  credits the request's hits;
- :class:`StoreRecord`: publishes the chunks it stored (or frees their slots); its
  remote puts (``remote_write=through``) are the workers' own, never committed;
- :class:`DemoteRecord`: frees the CPU slots of chunks written to SSD (a DEMOTE of
  remote puts alone, ``remote_write=back``, has nothing to commit);
- :class:`ClearRecord`: a reset of the SSD stores, nothing to commit.

:class:`JobTable` numbers the jobs and holds the records until they are committed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from miniflex.keys import Namespace
from miniflex.plan import (
    ChunkMove,
    JobId,
    JobKind,
    JobResult,
    LoadTiming,
    RemoteCopy,
    SlotCopy,
    TransferJob,
)
from miniflex.scheduler.advisor import HitAdvisor
from miniflex.scheduler.hits import served_by_tier
from miniflex.scheduler.requests import PendingLoad, ReqState
from miniflex.stats import TransferStats
from miniflex.tiers import ChunkSource, TierStack
from miniflex.types import BlockId, ChunkKey, SlotId, Tier

__all__ = [
    "ClearRecord",
    "CommitContext",
    "DemoteRecord",
    "JobRecord",
    "JobTable",
    "LoadRecord",
    "StoreRecord",
]


@dataclass(frozen=True)
class CommitContext:
    """What a record's report and commit act on (``stats``: the current interval's)."""

    ns: Namespace
    tiers: TierStack
    stats: TransferStats
    advisor: HitAdvisor


@dataclass
class JobRecord(ABC):
    """A job sent to ``pending_reports`` workers, until all of them have reported it."""

    job: TransferJob
    pending_reports: int
    ok: bool = field(default=True, kw_only=True)
    failed_blocks: set[BlockId] = field(default_factory=set, kw_only=True)
    failed_keys: set[ChunkKey] = field(default_factory=set, kw_only=True)

    def report(self, r: JobResult, ctx: CommitContext) -> bool:
        """One worker's result; True once every worker has reported."""
        self.pending_reports -= 1
        self.ok = self.ok and r.ok
        self.failed_blocks.update(r.failed_block_ids)
        self.failed_keys.update(r.failed_keys)
        ctx.stats.add_result(r)
        if r.ok:
            self.observe(r, ctx)
        return self.pending_reports <= 0

    def observe(self, r: JobResult, ctx: CommitContext) -> None:
        """Measurements from one worker's successful result (default: none)."""
        return None

    @abstractmethod
    def commit(self, ctx: CommitContext, st: ReqState | None) -> None:
        """Every worker has reported: commit (``ok``) or roll back. ``st``: the request's
        state, None when it is gone or the job is of no request."""


@dataclass
class LoadRecord(JobRecord):
    """A LOAD: ``sources`` pinned, one per chunk; ``block_tiers``: each job block's tier."""

    sources: list[ChunkSource] = field(default_factory=list)
    block_tiers: list[Tier] = field(default_factory=list)
    first_block: int = 0  # the request's block the load starts at
    counted: bool = False
    """The hits were credited to the request already (:meth:`settle`)."""
    seconds: dict[str, float] = field(default_factory=dict)
    """The slowest rank's wall time and its parts (``ReqAccount.load_seconds``)."""

    @classmethod
    def plan(
        cls, job_id: JobId, st: ReqState, load: PendingLoad, ns: Namespace, num_workers: int
    ) -> LoadRecord:
        """The LOAD of ``load`` into the request's blocks, with the promotions and remote
        fetches it needs."""
        bs, bpc = ns.block_size, ns.blocks_per_chunk
        b0, b1 = load.first_token // bs, (load.first_token + load.num_tokens) // bs
        chunks: list[ChunkMove] = []
        streams: list[SlotCopy | RemoteCopy] = []  # one per staging-slot ChunkMove, in order
        unavailable: list[BlockId] = []
        block_tiers: list[Tier] = []
        for b in range(b0, b1):
            i = b // bpc - b0 // bpc
            if i >= len(load.sources):
                unavailable.append(st.block_ids[b])
                continue
            src = load.sources[i]
            block_tiers.append(src.tier)
            if chunks and chunks[-1].slot == src.cpu:
                prev = chunks[-1]
                chunks[-1] = ChunkMove(prev.slot, (*prev.block_ids, st.block_ids[b]), prev.first)
            else:
                chunks.append(ChunkMove(src.cpu, (st.block_ids[b],), b % bpc))
                if src.streamed:
                    streams.append(_stream(src))
        promotions = tuple(
            SlotCopy(s.key, s.cpu, s.ssd)
            for s in load.sources
            if s.ssd is not None and not s.streamed
        )
        fetches = tuple(
            RemoteCopy(s.key, s.cpu) for s in load.sources if s.remote and not s.streamed
        )
        in_step = load.timing is not LoadTiming.ASYNC
        assert not (in_step and (fetches or streams)), "remote and streamed reads load async"
        job = TransferJob(
            job_id,
            st.req_id,
            JobKind.LOAD,
            tuple(chunks),
            unavailable=tuple(unavailable),
            promotions=promotions,
            timing=load.timing,
            remote=fetches,
            streams=tuple(streams),
        )
        return cls(
            job, num_workers, sources=list(load.sources), block_tiers=block_tiers, first_block=b0
        )

    def observe(self, r: JobResult, ctx: CommitContext) -> None:
        bad = set(r.failed_keys)
        promoted = sum(1 for c in self.sources if c.ssd is not None and c.key not in bad)
        fetched = sum(1 for c in self.sources if c.remote and c.key not in bad)
        ctx.advisor.observe_load(self.job.timing, promoted, r, fetched)
        if r.wall_seconds >= self.seconds.get("wall", 0.0):  # the slowest rank's
            self.seconds = {
                "wall": r.wall_seconds,
                "wait": r.wait_seconds,
                "ssd": r.ssd_seconds,
                "remote": r.remote_seconds,
                "copy": r.copy_seconds,
            }
        chunk_bytes = ctx.advisor.cost.chunk_bytes  # this rank's share of a chunk
        ctx.stats.ssd_read_bytes += promoted * chunk_bytes
        ctx.stats.remote_fetch_bytes += fetched * chunk_bytes

    def commit(self, ctx: CommitContext, st: ReqState | None) -> None:
        served = self._publish(ctx)
        if st is not None:
            st.load_job, st.load_job_sync = None, False
            if any(s.remote and s.key in self.failed_keys for s in self.sources):
                st.remote_answer = None  # ask the store again, not the old answer
            self._restore_stores(st, ctx.ns.blocks_per_chunk)
            if self.ok and self.seconds.get("wall"):  # every rank's load succeeded
                st.account.load_seconds |= self.seconds
            if not self.counted:
                st.account.credit(served)
                self._trace(st, self._good_blocks() if self.ok else 0, ctx.ns.blocks_per_chunk)
        if not self.ok:
            ctx.stats.failed_jobs += 1

    def settle(self, st: ReqState, ns: Namespace) -> None:
        """Credit the hits of a load inside the step that finishes the request, before its
        result arrives (it succeeded: vLLM does not finish a request whose load failed)."""
        if not self.counted:
            self.counted = True
            st.account.credit(served_by_tier(self.block_tiers, ns.block_size))
            self._trace(st, len(self.block_tiers), ns.blocks_per_chunk)

    def _trace(self, st: ReqState, good: int, blocks_per_chunk: int) -> None:
        """Note for the request's trace the blocks this load served (the first ``good``) and
        the chunks whose read failed (every chunk, if the job failed as a whole)."""
        served = self.block_tiers[:good]
        st.account.loaded_spans.append((self.first_block, tuple(served)))
        first = self.first_block // blocks_per_chunk
        st.account.loaded_below_cpu.update(
            self.sources[(self.first_block + i) // blocks_per_chunk - first].key
            for i, tier in enumerate(served)
            if tier is not Tier.CPU
        )
        st.failed_chunks.update(
            first + i
            for i, s in enumerate(self.sources)
            if not self.ok or s.key in self.failed_keys
        )

    def _publish(self, ctx: CommitContext) -> dict[str, int]:
        """Unpin and publish the chunks; returns the tokens vLLM won't recompute, per tier."""
        ctx.tiers.release(self.sources, self.ok, self.failed_keys)
        self._count_reads(ctx)
        if not self.ok:
            return {}
        served = served_by_tier(self.block_tiers[: self._good_blocks()], ctx.ns.block_size)
        ctx.stats.hit_tokens.update(served)
        return served

    def _good_blocks(self) -> int:
        """The job's blocks before the first that failed (or was unavailable): vLLM
        recomputes from there on."""
        bad = self.failed_blocks | set(self.job.unavailable)
        job_blocks = self.job.block_ids
        return next((i for i, b in enumerate(job_blocks) if b in bad), len(job_blocks))

    def _count_reads(self, ctx: CommitContext) -> None:
        """Count the chunks read from SSD and fetched from the remote store, and the failures."""
        for s in self.sources:
            bad = s.key in self.failed_keys
            if s.remote:
                ctx.stats.remote_read_failures += bad
                if s.streamed:
                    ctx.stats.remote_streamed_chunks += not bad
                else:
                    ctx.stats.remote_fetched_chunks += not bad
            elif s.streamed:
                ctx.stats.ssd_read_failures += bad
                ctx.stats.streamed_chunks += not bad
            elif s.ssd is not None:
                ctx.stats.ssd_read_failures += bad
                ctx.stats.promoted_chunks += not bad

    def _restore_stores(self, st: ReqState, blocks_per_chunk: int) -> None:
        """vLLM recomputes a load's blocks from the first failed one on: store them again
        (a load inside a step had its stores planned as if it would succeed)."""
        failed = self.failed_blocks if self.ok else set(self.job.block_ids)
        bad = set(self.job.unavailable) | failed
        first = next((i for i, b in enumerate(st.block_ids) if b in bad), None)
        if first is not None:
            st.stored_chunks = min(st.stored_chunks, first // blocks_per_chunk)


def _stream(src: ChunkSource) -> SlotCopy | RemoteCopy:
    """The read of a streamed chunk into its staging slot: from SSD, or from the store."""
    if src.remote:
        return RemoteCopy(src.key, src.cpu)
    assert src.ssd is not None
    return SlotCopy(src.key, src.cpu, src.ssd)


@dataclass
class StoreRecord(JobRecord):
    """A STORE into ``placed`` (key, CPU slot) pairs, invisible until committed."""

    placed: list[tuple[ChunkKey, SlotId]] = field(default_factory=list)

    @classmethod
    def plan(
        cls,
        job_id: JobId,
        st: ReqState,
        keys: Sequence[ChunkKey],
        placed: list[tuple[ChunkKey, SlotId]],
        ns: Namespace,
        num_workers: int,
        puts: bool = False,
    ) -> StoreRecord:
        """The STORE of the request's chunks ``placed`` (keys from ``keys``) into CPU slots;
        ``puts``: the workers also put them to the remote store (``remote_write=through``)."""
        index = {k: i for i, k in enumerate(keys)}
        bpc = ns.blocks_per_chunk
        chunks = [
            ChunkMove(slot, tuple(st.block_ids[index[k] * bpc : (index[k] + 1) * bpc]))
            for k, slot in placed
        ]
        remote = tuple(RemoteCopy(k, slot) for k, slot in placed) if puts else ()
        job = TransferJob(job_id, st.req_id, JobKind.STORE, tuple(chunks), remote=remote)
        return cls(job, num_workers, placed=placed)

    def commit(self, ctx: CommitContext, st: ReqState | None) -> None:
        ctx.tiers.complete_store(self.placed, self.ok)
        if st is not None:
            st.store_jobs.discard(self.job.job_id)
            # a prompt stored over several steps: its head becomes the most recent (chunks
            # of generated tokens keep their place at the cold end)
            warm = min(st.stored_chunks, st.prompt_chunks(ctx.ns.chunk_tokens))
            ctx.tiers.touch(st.keys.array[:warm])
        if self.ok:
            ctx.stats.stored_tokens += len(self.placed) * ctx.ns.chunk_tokens
        else:
            ctx.stats.failed_jobs += 1


@dataclass
class DemoteRecord(JobRecord):
    """A DEMOTE: CPU->SSD writes of chunks the CPU tier evicted (their CPU slots pinned)."""

    copies: list[SlotCopy] = field(default_factory=list)

    @classmethod
    def plan(
        cls,
        job_id: JobId,
        copies: Sequence[SlotCopy],
        puts: Sequence[RemoteCopy],
        num_workers: int,
    ) -> DemoteRecord:
        """A DEMOTE of no request: the CPU->SSD ``copies`` and the remote ``puts``."""
        job = TransferJob(
            job_id, None, JobKind.DEMOTE, (), demotions=tuple(copies), remote=tuple(puts)
        )
        return cls(job, num_workers, copies=list(copies))

    def observe(self, r: JobResult, ctx: CommitContext) -> None:
        ctx.tiers.observe_writes(len(self.copies), r.seconds)

    def commit(self, ctx: CommitContext, st: ReqState | None) -> None:
        if not self.copies:  # remote puts only: nothing to publish
            return
        failed = self.failed_keys if self.ok else {c.key for c in self.copies}
        ctx.tiers.complete_demotions(self.copies, failed)
        ctx.stats.demoted_chunks += len(self.copies) - len(failed)
        ctx.stats.ssd_write_failures += len(failed)


@dataclass
class ClearRecord(JobRecord):
    """A CLEAR: every worker rewrites its SSD journal empty; nothing to commit."""

    @classmethod
    def plan(cls, job_id: JobId, num_workers: int) -> ClearRecord:
        return cls(TransferJob(job_id, None, JobKind.CLEAR, ()), num_workers)

    def commit(self, ctx: CommitContext, st: ReqState | None) -> None:
        return None


class JobTable:
    """The records of the jobs in flight, by id; numbers new jobs."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self._records: dict[JobId, JobRecord] = {}
        self._next = 0

    def next_id(self) -> JobId:
        job_id, self._next = JobId(self._next), self._next + 1
        return job_id

    def add(self, record: JobRecord) -> TransferJob:
        """Track ``record`` until every worker has reported it; returns its job."""
        self._records[record.job.job_id] = record
        return record.job

    def get(self, job_id: JobId | None) -> JobRecord | None:
        return None if job_id is None else self._records.get(job_id)

    def report(self, r: JobResult, ctx: CommitContext) -> JobRecord | None:
        """Record one worker's result; the record once every worker has reported (it is
        then removed, for the caller to commit), else None (also for an unknown job)."""
        rec = self._records.get(r.job_id)
        if rec is None or not rec.report(r, ctx):
            return None
        del self._records[r.job_id]
        return rec

    def storing_chunks(self) -> int:
        """Chunks of the store jobs in flight."""
        return sum(len(r.placed) for r in self._records.values() if isinstance(r, StoreRecord))

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[JobRecord]:
        return iter(self._records.values())
