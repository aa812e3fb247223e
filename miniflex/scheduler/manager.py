"""The scheduler half of the connector: a coordinator of lookups, plans and commits.

It runs inside vLLM's scheduler (EngineCore process), owns the tier metadata
and never touches KV bytes. Per engine step:

1. ``lookup`` (from ``get_num_new_matched_tokens``): a side-effect-free prefix
   match, answered as a frozen :class:`~miniflex.scheduler.hits.Hit`
   (:class:`~miniflex.scheduler.lookup.HitLookup`; how much to load, and how,
   is the :class:`~miniflex.scheduler.advisor.HitAdvisor`'s call).
2. ``on_alloc`` (from ``update_state_after_alloc``): pins the hit chunks and
   records the blocks vLLM allocated for them.
3. ``build_plan`` (from ``build_connector_meta``): demotions (CPU->SSD writes
   of chunks the CPU tier evicted, and their remote puts with
   ``remote_write=back``), load jobs for step 2's requests (with the SSD->CPU
   promotions and remote fetches they need), store jobs for chunks that this
   step completes (:class:`~miniflex.scheduler.store_planner.StorePlanner`; and
   their remote puts with ``remote_write=through``), releases.
4. ``on_results`` (from ``update_connector_output``): two-phase commits of the
   jobs the workers finished, one record type per job kind
   (:mod:`miniflex.scheduler.jobs`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from miniflex.config import MiniFlexConfig
from miniflex.cost import make_cost_model
from miniflex.keys import Namespace
from miniflex.plan import JobResult, LoadProbe, LoadTiming, TransferJob, TransferPlan
from miniflex.remote.lookup import RemoteLookup
from miniflex.scheduler.advisor import HitAdvisor
from miniflex.scheduler.cuda_graphs import EAGER, GraphRule
from miniflex.scheduler.hits import Hit
from miniflex.scheduler.jobs import ClearRecord, CommitContext, DemoteRecord, JobTable, LoadRecord
from miniflex.scheduler.lookup import LANDING_WAIT_S, HitLookup
from miniflex.scheduler.manager_status import manager_status
from miniflex.scheduler.remote_puts import RemotePuts
from miniflex.scheduler.requests import PendingLoad, ReqState, ScheduledReq
from miniflex.scheduler.store_planner import StorePlanner
from miniflex.scheduler.tier_setup import build_tiers
from miniflex.scheduler.trace import RequestTrace
from miniflex.stats import TransferStats
from miniflex.tiers import SlotTier
from miniflex.tiers.remote_fetch import acquire_for_load
from miniflex.types import BlockId, ReqId

__all__ = ["LANDING_WAIT_S", "MiniFlexManager", "ScheduledReq"]

logger = logging.getLogger(__name__)


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
        remote: RemoteLookup | None = None,
        stream_slots: int = 0,
    ) -> None:
        """``chunk_bytes``: KV bytes of one chunk on one rank (for the cost model);
        ``step_tokens``: vLLM's ``max_num_batched_tokens`` (sizes the write-back; 0: unknown);
        ``graphs``: when the engine replays full CUDA graphs (in-step loads avoid them);
        ``max_model_len``: the longest prompt (its last chunk costs most to recompute);
        ``remote``: the remote tier's lookup (None: no ``remote_url``); ``stream_slots``: the
        workers' staging slots for SSD reads past the CPU tier (``pool.stream_slots``)."""
        self.config = config
        self.ns = ns
        self.graphs = graphs
        self.cost = make_cost_model(
            config, chunk_bytes, ns.chunk_tokens, ns.num_layers, step_tokens, ns.block_size
        )
        self.advisor = HitAdvisor(config, self.cost)
        self._step = 0
        self.remote = remote
        self.puts = RemotePuts(config.remote_write if remote else "off", chunk_bytes * num_workers)
        self.tiers = build_tiers(
            config,
            ns,
            self.cost,
            self.advisor,
            num_slots,
            ssd_slots,
            step_tokens,
            max_model_len,
            keep_evictions=self.puts.mode == "back",
            stream_slots=stream_slots,
        )
        self._lookup = HitLookup(
            ns, self.tiers, self.advisor, self.cost, graphs, config.load_mode, remote
        )
        self.num_workers = num_workers
        self.jobs = JobTable(num_workers)
        self._stores = StorePlanner(
            config, ns, self.tiers, self.jobs, self._lookup, self.puts, num_workers
        )
        self._reqs: dict[ReqId, ReqState] = {}
        self._to_load: list[ReqId] = []
        self._release: list[ReqId] = []
        self._release_next: list[ReqId] = []  # their last stores go out in this plan
        self._clear_ssd = False
        self.trace = RequestTrace(config.trace_file, ns)  # one line per finished request
        self.stats = TransferStats()  # since the last get_kv_connector_stats
        self.totals = TransferStats()  # before that

    @property
    def cpu(self) -> SlotTier:
        return self.tiers.cpu

    @property
    def ssd(self) -> SlotTier | None:
        return self.tiers.ssd

    # ---- request bookkeeping ----
    def state_for(self, req_id: ReqId) -> ReqState:
        """The request's state, created on first use."""
        st = self._reqs.get(req_id)
        if st is None:
            st = self._reqs[req_id] = ReqState(req_id)
        return st

    def find_state(self, req_id: ReqId) -> ReqState | None:
        """The request's state; None when MiniFlex does not track it (nothing is created)."""
        return self._reqs.get(req_id)

    @property
    def num_requests(self) -> int:
        return len(self._reqs)

    def _maybe_forget(self, st: ReqState) -> None:
        st.check()  # after every commit and finish
        if st.finished and not st.busy:
            del self._reqs[st.req_id]

    # ---- 1. lookup ----
    def lookup(
        self, req_id: ReqId, block_hashes: Sequence[bytes], num_tokens: int, num_computed: int
    ) -> Hit:
        """What MiniFlex can load beyond ``num_computed``. The request remembers the hit
        until the next lookup (``on_alloc`` pins it), and its chunks count as just used: a
        request that waits for vLLM's KV space is looked up again every step, and keeps its
        hit while it waits instead of losing it to the stores of the requests running."""
        st = self.state_for(req_id)
        st.hit = self._lookup.find(st, block_hashes, num_tokens, num_computed)
        self.tiers.touch(st.keys.array)
        return st.hit

    # ---- 2. allocation ----
    def on_alloc(self, req_id: ReqId, block_ids: Sequence[BlockId], num_external: int) -> None:
        """Pin the chunks to load into ``block_ids`` (the request's whole block table)."""
        st = self.state_for(req_id)
        st.block_ids = list(block_ids)
        looked_up_at, st.account.looked_up_at = st.account.looked_up_at, None  # the next is anew
        self.advisor.record(st, self.stats)
        self.trace.allocated(st)
        self.tiers.touch(st.keys.array)  # the whole prompt, vLLM's own hit included
        if num_external <= 0 or st.load is not None or st.load_job is not None:
            return
        ct, timing = self.ns.chunk_tokens, st.hit.timing
        first, end = st.num_computed_tokens, st.num_computed_tokens + num_external
        keys = st.keys[first // ct : -(-end // ct)]
        in_step = timing is not LoadTiming.ASYNC
        if in_step and not self.tiers.stream_slots:  # its workers read no SSD in a step
            keys = keys[: self.tiers.cpu.match(st.keys.array[first // ct : -(-end // ct)])]
        # A load inside the step reads SSD chunks into CPU slots only (no staging); what
        # cannot be placed since the lookup becomes load errors (recomputed).
        fetch = self.remote is not None and not in_step
        sources = acquire_for_load(self.tiers, keys, fetch, in_step)
        st.load = PendingLoad(first, num_external, sources, timing)
        st.account.start_load(timing, looked_up_at)  # the workers' times come with its result
        self.stats.load_timing[timing.value] += 1
        logger.debug("MiniFlex %s: %d tokens load %s", req_id, num_external, timing.value)
        self._to_load.append(req_id)
        st.check()

    # ---- 3. plans ----
    def build_plan(
        self,
        scheduled: Iterable[ScheduledReq],
        preempted: Iterable[ReqId],
        block_hashes: Mapping[ReqId, Sequence[bytes]],
    ) -> TransferPlan:
        """Everything the workers must do this step. ``block_hashes``: the block hashes of
        the requests the connector knows, read only for requests that complete a chunk in
        this step (a lazy view: most steps read none)."""
        # Preemptions first: vLLM may preempt and resume a request in one step
        # (reset_prefix_cache(reset_running_requests=True)); the block table it
        # got on resumption (on_alloc earlier in this step, or the scheduled
        # entries below) must win over the preemption.
        preempted = tuple(preempted)
        self._detach_preempted(preempted)
        loads = [j for r in self._to_load if (j := self._load_job(r)) is not None]
        self._to_load.clear()
        self._step += 1
        stores, tokens = self._schedule(scheduled, block_hashes)
        stores += self._retry_waiting()
        # Demotions go first, so that the disk starts on them at once (their CPU slots
        # stay pinned until they are written, so no job of this plan overwrites them).
        demote = self._demote_job()
        jobs = ([demote] if demote else []) + loads + stores
        if self._clear_ssd:  # before everything: demotions of this plan follow the reset
            self._clear_ssd = False
            jobs.insert(0, self.jobs.add(ClearRecord.plan(self.jobs.next_id(), self.num_workers)))
        release, self._release, self._release_next = tuple(self._release), self._release_next, []
        in_step = any(j.synchronous for j in loads)
        timed = self.advisor.end_step(self._step, timed=not in_step)
        return TransferPlan(
            jobs=tuple(jobs),
            release=release,
            preempted=preempted,
            step=self._step,
            full_graph=in_step and self.graphs.may_replay_full(tokens),
            timed=timed,
            forward=sum(tokens) > 0,
        )

    def _detach_preempted(self, preempted: tuple[ReqId, ...]) -> None:
        for r in preempted:
            st = self._reqs.get(r)
            if st is not None:
                if st.load is None:
                    st.block_ids = []
                # The worker waits for these stores before the next forward; their
                # results still commit by job id, but no longer hold the request.
                st.store_jobs.clear()
                st.store_due, st.store_waits_since = st.stored_chunks, None  # blocks gone

    def _schedule(
        self,
        scheduled: Iterable[ScheduledReq],
        block_hashes: Mapping[ReqId, Sequence[bytes]],
    ) -> tuple[list[TransferJob], list[int]]:
        """The store jobs of this step's scheduled requests, and the tokens each computes
        (may the step replay a full graph?)."""
        jobs: list[TransferJob] = []
        tokens: list[int] = []
        ct, store = self.ns.chunk_tokens, self.config.store
        for s in scheduled:
            tokens.append(s.num_scheduled_tokens)
            st = self.state_for(s.req_id)
            self.advisor.note_scheduled(
                self._step, st, s.num_scheduled_tokens, s.num_computed_tokens
            )
            if s.replace_blocks:
                st.block_ids = list(s.block_ids)
            elif s.block_ids:
                st.block_ids.extend(s.block_ids)
            done = s.num_computed_tokens + s.num_scheduled_tokens
            # Most steps of a decoding request complete no chunk: nothing to store, and
            # nothing else to look at (every engine step pays for this loop).
            if not store or done // ct <= st.stored_chunks:
                continue
            hashes = block_hashes.get(s.req_id)
            if hashes is not None:
                job = self._stores.job(st, hashes, done, self.stats)
                if job is not None:
                    jobs.append(job)
        return jobs, tokens

    def _retry_waiting(self) -> list[TransferJob]:
        """Stores of finished requests whose chunks waited for CPU slots. One whose last chunk
        is planned is released in the next plan: with a drafter, vLLM asks a worker what
        finished before it hands over a plan's stores."""
        jobs, done = self._stores.retry_waiting(self.stats)
        for st in done:
            self._release_next.append(st.req_id)
            self._maybe_forget(st)
        return jobs

    def on_probes(self, probes: Iterable[LoadProbe]) -> None:
        """The workers' start-up load probes (see :class:`HitAdvisor`)."""
        self.advisor.on_probes(probes)

    def on_clocks(
        self, scheduler_hooks: float = 0.0, worker_hooks: float = 0.0, thread_cpu: float = 0.0
    ) -> None:
        """Time taken from vLLM since the last call (``clocks.py``)."""
        self.stats.scheduler_hook_seconds += scheduler_hooks
        self.stats.worker_hook_seconds += worker_hooks
        self.stats.thread_cpu_seconds += thread_cpu

    def on_step_times(self, times: Iterable[tuple[int, float]]) -> None:
        """Forward times the workers measured: calibrate the prefill model, close TTFTs."""
        self.advisor.on_step_times(times, self._reqs, self.stats)

    def _demote_job(self) -> TransferJob | None:
        batch = self.tiers.take_demotions()
        self.stats.demotions_skipped += batch.skipped
        self.stats.demotions_declined += batch.declined
        puts = self.puts.back(batch.evicted, self.stats)
        if not (batch.copies or puts):
            return None
        rec = DemoteRecord.plan(self.jobs.next_id(), batch.copies, puts, self.num_workers)
        return self.jobs.add(rec)

    def _load_job(self, req_id: ReqId) -> TransferJob | None:
        st = self._reqs.get(req_id)
        if st is None or st.load is None:
            return None
        load, st.load = st.load, None
        rec = LoadRecord.plan(self.jobs.next_id(), st, load, self.ns, self.num_workers)
        self.jobs.add(rec)
        st.load_job = rec.job.job_id
        st.load_job_sync = rec.job.synchronous
        return rec.job

    # ---- 4. completions ----
    def on_results(self, results: Iterable[JobResult]) -> None:
        """Commit jobs once every worker has reported them (two-phase)."""
        ctx = CommitContext(self.ns, self.tiers, self.stats, self.advisor)
        for r in results:
            rec = self.jobs.report(r, ctx)
            if rec is None:
                continue
            st = self._reqs.get(rec.job.req_id) if rec.job.req_id is not None else None
            rec.commit(ctx, st)
            if st is not None:
                self._maybe_forget(st)

    def settle_hits(self, req_id: ReqId) -> ReqState:
        """The request's state as vLLM finishes it, its hits complete.

        vLLM finishes a request before it hands the connector that step's
        worker results, so the result of a load inside the finishing step may
        still be on its way. It succeeded: vLLM recomputes, and does not
        finish, a request whose load reported errors. Its hits are credited now.
        """
        st = self.state_for(req_id)
        rec = self.jobs.get(st.load_job)
        if isinstance(rec, LoadRecord) and st.load_job_sync:
            rec.settle(st, self.ns)
        return st

    def on_finished(self, req_id: ReqId) -> bool:
        """vLLM finished (or aborted) the request; True keeps its blocks until we release them."""
        st = self._reqs.get(req_id)
        if st is None:
            return False
        st.finished = True
        self.trace.finished(st)
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
        if st.store_waits:  # its blocks are kept until the last chunk is planned
            self._stores.waiting[req_id] = st
            return True
        if st.store_jobs:
            self._release.append(req_id)
            return True
        self._maybe_forget(st)
        return False

    # ---- counters, status, reset ----
    def take_stats(self) -> TransferStats:
        """The counters since the last call (vLLM's stats interval); totals keep them."""
        out, self.stats = self.stats, TransferStats()
        self.totals.merge(out)
        return out

    def status(self) -> dict[str, Any]:
        """Tiers, the cost model and cumulative counters (``miniflex inspect``'s view)."""
        return manager_status(self)

    def reset(self) -> int:
        """Forget every chunk in every tier; the workers clear their SSD stores in plan order."""
        if self.ssd is not None:
            self._clear_ssd = True
        return self.tiers.clear()

    def has_jobs(self) -> bool:
        return bool(
            len(self.jobs)
            or self._to_load
            or self._release
            or self._release_next
            or self._stores.waiting
            or self._clear_ssd
            or self.tiers.has_demotions()
        )

    def has_pending_frees(self) -> bool:
        return any(st.finished and st.busy for st in self._reqs.values())
