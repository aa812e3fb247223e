"""The scheduler half of the connector: lookups, load and store plans, commits.

It runs inside vLLM's scheduler (EngineCore process), owns the tier metadata
and never touches KV bytes. Per engine step:

1. ``lookup`` (from ``get_num_new_matched_tokens``): a side-effect-free prefix
   match of the request's chunk keys, starting after vLLM's own GPU hit; how
   much of it to load, and how, is the :class:`~miniflex.connector.advisor.HitAdvisor`'s
   call (the cost model, which it also keeps calibrated).
2. ``on_alloc`` (from ``update_state_after_alloc``): pins the hit chunks and
   records the blocks vLLM allocated for them.
3. ``build_plan`` (from ``build_connector_meta``): demotions (CPU->SSD writes
   of chunks the CPU tier evicted), load jobs for step 2's requests (with the
   SSD->CPU promotions they need), store jobs for chunks that this step
   completes, releases.
4. ``on_output`` (from ``update_connector_output``): two-phase commits of the
   jobs the workers finished, failed loads dropped from the tier.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from miniflex.config import MiniFlexConfig
from miniflex.connector.advisor import HitAdvisor
from miniflex.connector.cuda_graphs import EAGER, GraphRule
from miniflex.connector.requests import PendingLoad, ReqState, tokens_by_tier
from miniflex.cost import make_cost_model
from miniflex.index import keys_to_array
from miniflex.keys import Namespace, chunk_key
from miniflex.plan import (
    NO_REQUEST,
    ChunkMove,
    JobId,
    JobKind,
    JobResult,
    LoadProbe,
    LoadTiming,
    RemoteCopy,
    SlotCopy,
    TransferJob,
    TransferPlan,
)
from miniflex.remote.lookup import RemoteLookup
from miniflex.stats import TransferStats
from miniflex.tiers import ChunkSource, SlotTier, TierStack
from miniflex.tiers.admission import SSDAdmission
from miniflex.tiers.remote_fetch import acquire_fetches
from miniflex.types import BlockId, ChunkKey, ReqId, SlotId, Tier

__all__ = ["LANDING_WAIT_S", "MiniFlexManager", "ScheduledReq"]

logger = logging.getLogger("miniflex.manager")

LANDING_WAIT_S = 0.5
"""Longest a request's lookup waits for a chunk on its way to SSD (see ``lookup``)."""


@dataclass(frozen=True)
class ScheduledReq:
    """A request scheduled this step, as vLLM's SchedulerOutput describes it."""

    req_id: ReqId
    num_computed_tokens: int  # before this step
    num_scheduled_tokens: int
    block_ids: tuple[BlockId, ...]
    replace_blocks: bool  # True: block_ids is the whole table, else new blocks to append


@dataclass
class _Job:
    job: TransferJob
    pending_reports: int
    placed: list[tuple[ChunkKey, SlotId]] = field(default_factory=list)  # stores
    sources: list[ChunkSource] = field(default_factory=list)  # loads
    block_tiers: list[Tier] = field(default_factory=list)  # loads: tier of each job block
    copies: list[SlotCopy] = field(default_factory=list)  # demotions
    ok: bool = True
    counted: bool = False  # loads: hits already credited to the request (settle_hits)
    failed_blocks: set[BlockId] = field(default_factory=set)
    failed_keys: set[ChunkKey] = field(default_factory=set)


def _writeback_chunks(
    config: MiniFlexConfig, num_slots: int, chunk_bytes: int, step_chunks: int
) -> int:
    """``ssd_write_backlog`` in chunks. ``auto``: one engine step's worth of chunks, so that
    a disk that writes a step's KV within a step drops nothing; within 1/8 to 1/2 of the CPU
    tier (a quarter when the step size is unknown). Always leaves a slot to store into."""
    if config.ssd_write_backlog is not None and chunk_bytes > 0:
        n = config.ssd_write_backlog // chunk_bytes
    elif step_chunks > 0:
        n = min(max(step_chunks, num_slots // 8), num_slots // 2)
    else:
        n = num_slots // 4
    return max(1, min(n, num_slots - 1))


class MiniFlexManager:
    """Scheduler-side MiniFlex for one engine; ``num_workers`` ranks report every job."""

    def __init__(
        self,
        config: MiniFlexConfig,
        ns: Namespace,
        num_slots: int,
        num_workers: int = 1,
        ssd_slots: int = 0,
        chunk_bytes: int = 0,
        step_tokens: int = 0,
        graphs: GraphRule = EAGER,
        max_model_len: int = 0,
    ) -> None:
        """``chunk_bytes``: KV bytes of one chunk on one rank (for the cost model);
        ``step_tokens``: vLLM's ``max_num_batched_tokens`` (sizes the write-back; 0: unknown);
        ``graphs``: when the engine replays full CUDA graphs (in-step loads avoid them);
        ``max_model_len``: the longest prompt (its last chunk costs most to recompute)."""
        self.config = config
        self.ns = ns
        self.graphs = graphs
        self.cost = make_cost_model(config, chunk_bytes, ns.chunk_tokens, ns.num_layers)
        self.advisor = HitAdvisor(config, self.cost)
        self._step = 0
        self.tiers = TierStack(
            num_slots,
            config.cpu_eviction,
            ssd_slots,
            config.ssd_eviction,
            write_through=config.ssd_write == "through",
            max_writeback=_writeback_chunks(
                config, num_slots, chunk_bytes, -(-step_tokens // ns.chunk_tokens)
            ),
            wait_budget=self.advisor.write_wait_budget,
            recompute_seconds=self.cost.chunk_recompute_seconds,
            admission=SSDAdmission(
                self.cost.ssd_chunk_seconds,
                lambda: self.cost.chunk_recompute_seconds(max_model_len),
            ),
            on_cpu_evict=self._evicted,
        )
        if ssd_slots > 0 and chunk_bytes > 0:  # until writes are seen: as fast as reads
            self.tiers.write_seconds = chunk_bytes / self.cost.bandwidth[Tier.SSD]
        self.num_workers = num_workers
        self.remote: RemoteLookup | None = None
        """The remote tier's lookup (``remote_url``), set by the connector's start-up."""
        self._remote_back: list[RemoteCopy] = []  # evicted from CPU, to put (remote_write=back)
        self._reqs: dict[ReqId, ReqState] = {}
        self._jobs: dict[JobId, _Job] = {}
        self._next_job = 0
        self._to_load: list[ReqId] = []
        self._release: list[ReqId] = []
        self._clear_ssd = False
        self.stats = TransferStats()  # since the last get_kv_connector_stats
        self.totals = TransferStats()  # before that

    @property
    def cpu(self) -> SlotTier:
        return self.tiers.cpu

    @property
    def ssd(self) -> SlotTier | None:
        return self.tiers.ssd

    # ---- request bookkeeping ----
    def state(self, req_id: ReqId) -> ReqState:
        st = self._reqs.get(req_id)
        if st is None:
            st = self._reqs[req_id] = ReqState(req_id)
        return st

    def _keys(self, st: ReqState, block_hashes: Sequence[bytes]) -> list[ChunkKey]:
        """The request's chunk keys, extended (or cut back) to match its block hashes.

        vLLM can rewrite a request's trailing hashes (streaming-input sessions
        replace the tail of a prompt), so keys whose source hash changed are
        dropped first. Hashes chain, so the last key that still matches vouches
        for every key before it; normally that is the first one checked.
        """
        bpc = self.ns.blocks_per_chunk
        n = min(len(st.keys), len(block_hashes) // bpc)
        while n and block_hashes[n * bpc - 1] != st.key_sources[n - 1]:
            n -= 1
        if n < len(st.keys):
            del st.keys[n:], st.key_sources[n:]
            st.key_array = st.key_array[:n]
            st.stored_chunks = min(st.stored_chunks, n)
        full = len(block_hashes) // bpc
        if full > n:
            sources = [bytes(block_hashes[i * bpc - 1]) for i in range(n + 1, full + 1)]
            new = [chunk_key(self.ns, h) for h in sources]
            st.keys += new
            st.key_sources += sources
            st.key_array = np.concatenate([st.key_array, keys_to_array(new)])
        return st.keys

    # ---- 1. lookup ----
    def lookup(
        self, req_id: ReqId, block_hashes: Sequence[bytes], num_tokens: int, num_computed: int
    ) -> int | None:
        """Tokens beyond ``num_computed`` that MiniFlex can load; no side effect on tiers.

        None: ask again in a later step. The run of resident chunks ends at one on its way to
        SSD, readable nowhere until its write is reported (within a step or two); waiting
        beats recomputing the rest of the prompt, for as long as that recompute would take.
        """
        st = self.state(req_id)
        st.num_computed_tokens = num_computed
        st.num_prompt_tokens = num_tokens
        keys = self._keys(st, block_hashes)
        ct, bs = self.ns.chunk_tokens, self.ns.block_size
        start = num_computed // ct
        st.decision = None
        st.timing = LoadTiming.ASYNC
        hit = self.tiers.match(st.key_array[start:]) if start < len(keys) else 0
        tiers: list[Tier] = []
        if hit and self.ssd is not None:
            run = st.key_array[start : start + hit]
            # exact (a chunk being promoted ends the run); the CPU prefix in one compiled call
            tiers = self.tiers.residence(keys[start : start + hit], self.cpu.match(run))
        elif hit:
            tiers = [Tier.CPU] * hit
        if self._wait_for_landing(st, keys, start + len(tiers)):
            return None
        if self.remote is not None:  # the chunks after the local run that the store holds
            end = start + len(tiers)
            ask = keys[end : start + self.tiers.max_load_chunks]
            tiers = tiers + [Tier.REMOTE] * self.remote.held(st.req_id, ask)
            hit = len(tiers)
        st.resident_by_tier = tokens_by_tier(tiers, start * ct, num_tokens, ct)
        if any(t is not Tier.CPU for t in tiers):  # a load stages its chunks in CPU slots
            tiers = tiers[: self.tiers.max_load_chunks]
        if hit:
            slow = self.ssd is not None or self.remote is not None
            hit = self.advisor.decide(st, tiers, num_tokens, num_computed, slow)
        end = min((start + hit) * ct, (num_tokens - 1) // bs * bs)
        if end <= num_computed or (
            self.config.load_mode == "auto" and not self.graphs.in_step_sees_hooks(num_tokens - end)
        ):
            # auto: an in-step load only overlaps a step that runs attention eagerly
            st.timing = LoadTiming.ASYNC
        return max(0, end - num_computed)

    def _wait_for_landing(self, st: ReqState, keys: list[ChunkKey], end: int) -> bool:
        """True: the chunk after the resident run (``keys[end]``) is landing on SSD and the
        request has waited for it less than recomputing the rest of its prompt would take
        (by the prefill fit; LANDING_WAIT_S at least, and before a fit). Only where the disk
        keeps up with recomputing: on a slower one, the chunks on SSD save little or nothing.
        A disk's sync can stall for a while on a busy machine; the wait is worth it as long
        as it is shorter than the recompute it saves."""
        if (
            self.ssd is None
            or end >= len(keys)
            or not self.tiers.landing(keys[end])  # a dict lookup: first, on every lookup
            or not self.tiers.disk_keeps_up
        ):
            st.landing_since = None
            return False
        now = time.monotonic()
        if st.landing_since is None:
            st.landing_since = now
        done = end * self.ns.chunk_tokens
        fit = self.cost.prefill
        rest = fit.seconds(st.num_prompt_tokens - done, done) if fit is not None else 0.0
        return now - st.landing_since < max(LANDING_WAIT_S, rest)

    def load_async(self, req_id: ReqId) -> bool:
        """Whether the hit of the request's last lookup loads asynchronously (vLLM's
        ``load_kv_async``); False: it loads inside the step that computes the rest."""
        st = self._reqs.get(req_id)
        return st is None or st.timing is LoadTiming.ASYNC

    # ---- 2. allocation ----
    def on_alloc(self, req_id: ReqId, block_ids: Sequence[BlockId], num_external: int) -> None:
        """Pin the chunks to load into ``block_ids`` (the request's whole block table)."""
        st = self.state(req_id)
        st.block_ids = list(block_ids)
        self.advisor.record(st, self.stats)
        self.tiers.touch(st.key_array)  # the whole prompt, vLLM's own hit included
        if num_external <= 0 or st.load is not None or st.load_job is not None:
            return
        ct = self.ns.chunk_tokens
        first, end = st.num_computed_tokens, st.num_computed_tokens + num_external
        keys = st.keys[first // ct : -(-end // ct)]
        if st.timing is not LoadTiming.ASYNC:
            # Only chunks still in CPU load inside the step; one that another request's
            # promotion evicted since the lookup becomes a load error (recomputed).
            keys = keys[: self.cpu.match(st.key_array[first // ct : -(-end // ct)])]
        sources = self.tiers.acquire(keys)
        if self.remote is not None and st.timing is LoadTiming.ASYNC and len(sources) < len(keys):
            sources += acquire_fetches(self.cpu, keys[len(sources) :])
        st.load = PendingLoad(first, num_external, sources, st.timing)
        st.loaded_as = st.timing
        self.stats.load_timing[st.timing.value] += 1
        logger.debug("MiniFlex %s: %d tokens load %s", req_id, num_external, st.timing.value)
        self._to_load.append(req_id)

    # ---- 3. plans ----
    def build_plan(
        self, scheduled: Iterable[ScheduledReq], preempted: Iterable[ReqId], block_hashes: dict
    ) -> TransferPlan:
        """Everything the workers must do this step. ``block_hashes``: req_id -> hashes."""
        # Preemptions first: vLLM may preempt and resume a request in one step
        # (reset_prefix_cache(reset_running_requests=True)); the block table it
        # got on resumption (on_alloc earlier in this step, or the scheduled
        # entries below) must win over the preemption.
        preempted = tuple(preempted)
        for r in preempted:
            st = self._reqs.get(r)
            if st is not None:
                if st.load is None:
                    st.block_ids = []
                # The worker waits for these stores before the next forward; their
                # results still commit by job id, but no longer hold the request.
                st.store_jobs.clear()
        loads = [j for r in self._to_load if (j := self._load_job(r)) is not None]
        self._to_load.clear()
        jobs: list[TransferJob] = []
        tokens: list[int] = []  # scheduled per request: may the step replay a full graph?
        self._step += 1
        for s in scheduled:
            tokens.append(s.num_scheduled_tokens)
            st = self.state(s.req_id)
            self.advisor.note_scheduled(
                self._step, st, s.num_scheduled_tokens, s.num_computed_tokens
            )
            st.block_ids = (
                list(s.block_ids) if s.replace_blocks else st.block_ids + list(s.block_ids)
            )
            hashes = block_hashes.get(s.req_id)
            if hashes is not None and self.config.store:
                job = self._store_job(st, hashes, s.num_computed_tokens + s.num_scheduled_tokens)
                if job is not None:
                    jobs.append(job)
        # Demotions go first, so that the disk starts on them at once (their CPU slots
        # stay pinned until they are written, so no job of this plan overwrites them).
        demote = self._demote_job()
        jobs = ([demote] if demote else []) + loads + jobs
        if self._clear_ssd:  # before everything: demotions of this plan follow the reset
            self._clear_ssd = False
            jobs.insert(0, self._system_job(JobKind.CLEAR, ()))
        release, self._release = tuple(self._release), []
        in_step = any(j.synchronous for j in loads)
        self.advisor.end_step(self._step, timed=not in_step)
        full_graph = in_step and self.graphs.may_replay_full(tokens)
        return TransferPlan(
            jobs=tuple(jobs),
            release=release,
            preempted=preempted,
            step=self._step,
            full_graph=full_graph,
        )

    def on_probes(self, probes: Iterable[LoadProbe]) -> None:
        """The workers' start-up load probes (see :class:`HitAdvisor`)."""
        self.advisor.on_probes(probes)

    def on_clocks(
        self, scheduler_hooks: float = 0.0, worker_hooks: float = 0.0, thread_cpu: float = 0.0
    ) -> None:
        """Time taken from vLLM since the last call (``connector/hook_clock.py``)."""
        self.stats.scheduler_hook_seconds += scheduler_hooks
        self.stats.worker_hook_seconds += worker_hooks
        self.stats.thread_cpu_seconds += thread_cpu

    def on_step_times(self, times: Iterable[tuple[int, float]]) -> None:
        """Forward times the workers measured: calibrate the prefill model, close TTFTs."""
        self.advisor.on_step_times(times, self._reqs, self.stats)

    def _demote_job(self) -> TransferJob | None:
        copies = self.tiers.take_demotions()
        self.stats.demotions_skipped += self.tiers.take_skipped_demotions()
        self.stats.demotions_declined += self.tiers.take_declined_demotions()
        puts, self._remote_back = tuple(self._remote_back), []
        self.stats.remote_puts += len(puts)
        if not (copies or puts):
            return None
        return self._system_job(JobKind.DEMOTE, tuple(copies), puts)

    def _evicted(self, key: ChunkKey, slot: SlotId) -> None:
        """A chunk leaves the CPU tier: with ``remote_write=back``, put it to the store first
        (the plan's first job; the worker copies the slot before any job overwrites it)."""
        if self.remote is not None and self.config.remote_write == "back":
            self._remote_back.append(RemoteCopy(key, slot))

    def _system_job(
        self, kind: JobKind, copies: tuple[SlotCopy, ...], puts: tuple[RemoteCopy, ...] = ()
    ) -> TransferJob:
        """A job of no request (DEMOTE, CLEAR), tracked until every worker reports it."""
        job = TransferJob(JobId(self._next_job), NO_REQUEST, kind, (), ssd=copies, remote=puts)
        self._next_job += 1
        self._jobs[job.job_id] = _Job(job, self.num_workers, copies=list(copies))
        return job

    def _new_job(
        self, st: ReqState, kind: JobKind, chunks: list[ChunkMove], **kw: object
    ) -> TransferJob:
        job = TransferJob(JobId(self._next_job), st.req_id, kind, tuple(chunks), **kw)  # type: ignore[arg-type]
        self._next_job += 1
        return job

    def _load_job(self, req_id: ReqId) -> TransferJob | None:
        st = self._reqs.get(req_id)
        if st is None or st.load is None:
            return None
        load, st.load = st.load, None
        bs, bpc = self.ns.block_size, self.ns.blocks_per_chunk
        b0, b1 = load.first_token // bs, (load.first_token + load.num_tokens) // bs
        chunks: list[ChunkMove] = []
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
        promotions = tuple(SlotCopy(s.key, s.cpu, s.ssd) for s in load.sources if s.ssd is not None)
        fetches = tuple(RemoteCopy(s.key, s.cpu) for s in load.sources if s.remote)
        reads = promotions or fetches
        assert not (reads and load.timing is not LoadTiming.ASYNC), "SSD, remote reads load async"
        job = self._new_job(
            st,
            JobKind.LOAD,
            chunks,
            unavailable=tuple(unavailable),
            ssd=promotions,
            timing=load.timing,
            remote=fetches,
        )
        self._jobs[job.job_id] = _Job(
            job, self.num_workers, sources=list(load.sources), block_tiers=block_tiers
        )
        st.load_job = job.job_id
        st.load_job_sync = job.synchronous
        return job

    def _store_job(
        self, st: ReqState, hashes: Sequence[bytes], done_tokens: int
    ) -> TransferJob | None:
        keys = self._keys(st, hashes)
        full = min(
            len(keys),
            done_tokens // self.ns.chunk_tokens,
            len(st.block_ids) // self.ns.blocks_per_chunk,
        )
        if full <= st.stored_chunks:
            return None
        if sum(len(j.placed) for j in self._jobs.values()) >= self.config.max_inflight_chunks:
            self.stats.stores_skipped += full - st.stored_chunks
            st.stored_chunks = full  # skipped for good, not retried (and counted) every step
            return None
        first = st.stored_chunks
        st.stored_chunks = full
        placed = self.tiers.prepare_store(keys[first:full])
        # chunks neither placed nor already in CPU found no slot (every one pinned): lost
        done = {k for k, _ in placed}
        self.stats.stores_skipped += sum(
            1
            for k in keys[first:full]
            if k not in done and k not in self.cpu and not self.cpu.is_storing(k)
        )
        if not placed:
            return None
        index = {k: i for i, k in enumerate(keys)}
        bpc = self.ns.blocks_per_chunk
        chunks = [
            ChunkMove(slot, tuple(st.block_ids[index[k] * bpc : (index[k] + 1) * bpc]))
            for k, slot in placed
        ]
        st.stored_tokens += len(placed) * self.ns.chunk_tokens
        puts = ()
        if self.remote is not None and self.config.remote_write == "through":
            puts = tuple(RemoteCopy(k, slot) for k, slot in placed)
            self.stats.remote_puts += len(puts)
        job = self._new_job(st, JobKind.STORE, chunks, remote=puts)
        self._jobs[job.job_id] = _Job(job, self.num_workers, placed=placed)
        st.store_jobs.add(job.job_id)
        return job

    # ---- 4. completions ----
    def on_results(self, results: Iterable[JobResult]) -> None:
        """Commit jobs once every worker has reported them (two-phase)."""
        for r in results:
            rec = self._jobs.get(r.job_id)
            if rec is None:
                continue
            rec.pending_reports -= 1
            rec.ok = rec.ok and r.ok
            rec.failed_blocks.update(r.failed_block_ids)
            rec.failed_keys.update(r.failed_keys)
            self.stats.add_result(r)
            if r.kind is JobKind.LOAD and r.ok:
                bad = set(r.failed_keys)
                promoted = sum(1 for c in rec.sources if c.ssd is not None and c.key not in bad)
                fetched = sum(1 for c in rec.sources if c.remote and c.key not in bad)
                self.advisor.observe_load(rec.job.timing, promoted, r, fetched)
            elif r.kind is JobKind.DEMOTE and r.ok:
                self.tiers.observe_writes(len(rec.copies), r.seconds)
            if rec.pending_reports > 0:
                continue
            del self._jobs[r.job_id]
            if r.kind is JobKind.DEMOTE:
                self._commit_demote(rec)
                continue
            if r.kind is JobKind.CLEAR:
                continue
            st = self._reqs.get(r.req_id)
            if r.kind is JobKind.STORE:
                self.tiers.complete_store(rec.placed, rec.ok)
                if st is not None:
                    st.store_jobs.discard(r.job_id)
                    # a prompt stored over several steps: its head becomes the most recent
                    self.tiers.touch(st.key_array[: st.stored_chunks])
                if rec.ok:
                    self.stats.stored_tokens += len(rec.placed) * self.ns.chunk_tokens
            else:
                served = self._commit_load(rec)
                if st is not None:
                    st.load_job, st.load_job_sync = None, False
                    self._restore_stores(st, rec)
                    if not rec.counted:
                        self._credit(st, served)
            if not rec.ok:
                self.stats.failed_jobs += 1
            if st is not None:
                self._maybe_forget(st)

    def _credit(self, st: ReqState, served: dict[str, int]) -> None:
        st.hit_tokens += sum(served.values())
        for tier, n in served.items():
            st.hit_by_tier[tier] = st.hit_by_tier.get(tier, 0) + n

    def settle_hits(self, req_id: ReqId) -> ReqState:
        """The request's state as vLLM finishes it, its hits complete.

        vLLM finishes a request before it hands the connector that step's
        worker results, so the result of a load inside the finishing step may
        still be on its way. It succeeded: vLLM recomputes, and does not
        finish, a request whose load reported errors. Its hits are credited now.
        """
        st = self.state(req_id)
        rec = self._jobs.get(st.load_job) if st.load_job is not None else None
        if rec is not None and st.load_job_sync and not rec.counted:
            rec.counted = True
            served: dict[str, int] = {}
            for tier in rec.block_tiers:
                name = tier.name.lower()
                served[name] = served.get(name, 0) + self.ns.block_size
            self._credit(st, served)
        return st

    def _restore_stores(self, st: ReqState, rec: _Job) -> None:
        """vLLM recomputes a load's blocks from the first failed one on: store them again
        (a load inside a step had its stores planned as if it would succeed)."""
        bad = set(rec.job.unavailable) | (rec.failed_blocks if rec.ok else set(rec.job.block_ids))
        first = next((i for i, b in enumerate(st.block_ids) if b in bad), None)
        if first is not None:
            st.stored_chunks = min(st.stored_chunks, first // self.ns.blocks_per_chunk)

    def _commit_load(self, rec: _Job) -> dict[str, int]:
        """Unpin and publish a finished load; returns the tokens vLLM won't recompute, per tier."""
        self.tiers.release(rec.sources, rec.ok, rec.failed_keys)
        for s in rec.sources:
            bad = s.key in rec.failed_keys
            if s.ssd is not None:
                self.stats.ssd_read_failures += bad
                self.stats.promoted_chunks += not bad
            elif s.remote:
                self.stats.remote_read_failures += bad
                self.stats.remote_fetched_chunks += not bad
                if bad and self.remote is not None:  # ask the store again, not the old answer
                    self.remote.forget(rec.job.req_id)
        if not rec.ok:
            return {}
        # vLLM recomputes from the first block that failed (or was unavailable) on.
        bad = rec.failed_blocks | set(rec.job.unavailable)
        job_blocks = rec.job.block_ids
        good = next((i for i, b in enumerate(job_blocks) if b in bad), len(job_blocks))
        served: dict[str, int] = {}
        for tier in rec.block_tiers[:good]:
            name = tier.name.lower()
            served[name] = served.get(name, 0) + self.ns.block_size
        self.stats.hit_tokens.update(served)
        return served

    def _commit_demote(self, rec: _Job) -> None:
        if not rec.copies:  # remote puts only: nothing to publish
            return
        failed = rec.failed_keys if rec.ok else {c.key for c in rec.copies}
        self.tiers.complete_demotions(rec.copies, failed)
        self.stats.demoted_chunks += len(rec.copies) - len(failed)
        self.stats.ssd_write_failures += len(failed)

    def on_finished(self, req_id: ReqId) -> bool:
        """vLLM finished (or aborted) the request; True keeps its blocks until we release them."""
        st = self._reqs.get(req_id)
        if st is None:
            return False
        st.finished = True
        if st.load is not None:  # aborted before its load was even sent
            self.tiers.cancel(st.load.sources)
            st.load = None
            self._to_load = [r for r in self._to_load if r != req_id]
        if st.load_job is not None and not st.load_job_sync:
            # vLLM frees the blocks on the load's finished_recving; reporting a
            # release too would free them twice. Stores only follow computation,
            # and a preemption detaches them (build_plan), so there are none here.
            assert not st.store_jobs, f"{req_id} loads and stores at once"
            return True
        if st.store_jobs:
            self._release.append(req_id)
            return True
        self._maybe_forget(st)
        return False

    def take_stats(self) -> TransferStats:
        """The counters since the last call (vLLM's stats interval); totals keep them."""
        out, self.stats = self.stats, TransferStats()
        self.totals.merge(out)
        return out

    def status(self) -> dict[str, Any]:
        """Tiers, the cost model and cumulative counters (``miniflex inspect``'s view)."""
        tiers = [self.cpu.usage()] + ([self.ssd.usage()] if self.ssd is not None else [])
        cost = self.cost
        prefill = cost.prefill
        return {
            "namespace": self.ns.digest.hex(),
            "chunk_tokens": self.ns.chunk_tokens,
            "tiers": [
                {
                    "tier": u.tier.name.lower(),
                    "slots": u.num_slots,
                    "resident": u.resident,
                    "pinned_or_moving": u.pinned_or_moving,
                    "free": u.free,
                    "evictions": u.evictions,
                }
                for u in tiers
            ],
            "cost_model": {
                "hit_policy": self.config.hit_policy,
                "calibrated": cost.calibrated,
                "ssd_admits": self.tiers.ssd_pays_off if self.ssd is not None else None,
                "observed_steps": cost.observed_steps,
                "load_GBps": {t.name.lower(): bw / 1e9 for t, bw in cost.bandwidth.items()},
                "layerwise_load_GBps": None
                if cost.layerwise_bandwidth is None
                else cost.layerwise_bandwidth / 1e9,
                "prefill": None
                if prefill is None
                else {
                    "step_s": prefill.step,
                    "per_token_s": prefill.per_token,
                    "per_pair_s": prefill.per_pair,
                },
            },
            "remote": self.remote.status() if self.remote is not None else None,
            "requests_tracked": len(self._reqs),
            "jobs_in_flight": len(self._jobs),
            "totals": TransferStats().merge(self.totals).merge(self.stats).as_counters(),
        }

    def reset(self) -> int:
        """Forget every chunk in every tier; the workers clear their SSD stores in plan order."""
        if self.ssd is not None:
            self._clear_ssd = True
        self._remote_back.clear()  # pre-reset bytes are never put
        return self.tiers.clear()

    def has_jobs(self) -> bool:
        return bool(
            self._jobs
            or self._to_load
            or self._release
            or self._clear_ssd
            or self.tiers.has_demotions()
            or bool(self._remote_back)
        )

    def has_pending_frees(self) -> bool:
        return any(st.finished and st.busy for st in self._reqs.values())

    def _maybe_forget(self, st: ReqState) -> None:
        if st.finished and not st.busy:
            del self._reqs[st.req_id]
            if self.remote is not None:
                self.remote.forget(st.req_id)
