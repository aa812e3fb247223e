"""The worker half of the connector: executes plans, reports what finished.

It runs in each vLLM worker process and owns the bytes: the CPU pool, a
pair of movers bound to vLLM's KV tensors and, with ``ssd_dirs``, this rank's SSD
store. Its jobs run on lanes, one queue and thread per medium pair (``lanes.py``),
each in plan order:

* loads run on the gpu-load lane with one mover (its own CUDA stream and staging
  buffers), stores on the gpu-store lane with the other, so a load never waits behind a
  store waiting for its forward, and both directions of the PCIe link are used at once.
  They never touch the same bytes: a load reads committed chunks into blocks no forward
  has computed yet (a preempted request's blocks are handed out again only once its
  stores are done, see below), and a store writes a free slot that no load reads;
* writes to SSD (demotions, clearing the store) run on the ssd-write lane, a load's
  SSD reads on the ssd-read lane and its remote fetches on the remote-fetch lane, so a
  slow disk or store never holds up GPU copies, nor a stalled store another
  request's disk reads;
* a demotion (CPU slot -> SSD) is registered against its CPU slot when it is queued,
  before the jobs of the same plan; a store or read into that slot is queued for its
  lane only once it is written, so the jobs queued after it never wait for the disk;
  no other job reads or writes a slot being stored or promoted into;
* a job with remote puts (a store's write-through, a write-back's) is reported
  done as soon as its own copy is, so vLLM gets its blocks back; its slots are
  then copied for the puts on the uploader's copy threads (the gpu-store lane goes
  on with the next store), and are registered the same way until they are
  (``slot_guard.py``);
* asynchronous loads are queued at ``start_load_kv``, into blocks of requests that wait
  for them, which no forward touches. A load with reads is chained from lane to lane
  once its slots are written back, like a store: remote fetches, SSD promotions, then
  its GPU copies; chunks past the CPU tier stream part by part (``streams.py``), without
  waiting for those slots (``LoadReads.submit_after``);
* loads inside a step (SYNC, LAYERWISE) are issued on vLLM's thread at
  ``start_load_kv`` and finished once the forward is issued (``step_loads.py``);
  their SSD chunks are read layer by layer meanwhile (``step_reads.py``);
* stores are queued at ``wait_for_save``, after the forward that computed their blocks,
  a plan's as one copy (``store_batch.py``), but never those of a request whose in-step
  load failed in that step (computed over bytes that never arrived: reported failed,
  nothing stored or put); a finished request keeps its blocks until its stores are done;
* a preempted request's stores are waited for before the next forward.

Any exception in a job is caught here, logged, and reported as a failed job
(a failed load becomes load errors, so vLLM recomputes those blocks).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import replace

import torch

from miniflex.config import MiniFlexConfig
from miniflex.errors import TransferError
from miniflex.gpu import pinning
from miniflex.gpu.base import KVMover
from miniflex.layout import KVLayout
from miniflex.plan import JobKind, JobResult, LoadProbe, PutOutcome, TransferJob, TransferPlan
from miniflex.pool import HostPool
from miniflex.ranks import RankSetup
from miniflex.remote.tier import WorkerRemote, put_groups
from miniflex.ssd.copier import SSDCopier
from miniflex.types import BlockId, ReqId
from miniflex.worker.completions import Completions
from miniflex.worker.job_runner import (
    PutGroup,
    QueuedJob,
    execute,
    fail_unreported,
    failed_result,
    resolver,
    started,
    waited,
)
from miniflex.worker.lanes import Lane
from miniflex.worker.load_reads import LoadReads
from miniflex.worker.probe import probe_rank
from miniflex.worker.rank_io import open_rank_io
from miniflex.worker.slot_guard import SlotGuard
from miniflex.worker.step_loads import StepLoads
from miniflex.worker.step_reads import StepReads
from miniflex.worker.step_timer import StepTimer
from miniflex.worker.store_batch import StoreBatch, execute_stores
from miniflex.worker.streams import StagingRing

__all__ = ["MiniFlexHandler"]

logger = logging.getLogger(__name__)


_OVER_FAILED = "computed over an in-step load that failed; dropped"

_GROUPS = {
    JobKind.LOAD: (JobKind.CLEAR, JobKind.DEMOTE, JobKind.LOAD),  # queued before the forward
    JobKind.STORE: (JobKind.STORE,),  # queued after it
}


class MiniFlexHandler:
    """Worker-side MiniFlex for one rank; call ``register`` before anything else."""

    def __init__(self, config: MiniFlexConfig, remote: WorkerRemote | None = None) -> None:
        """``remote``: this rank's remote tier, opened and checked (None: no ``remote_url``)."""
        self.config = config
        self._remote = remote
        self.layout: KVLayout | None = None
        self._pool: HostPool | None = None
        self._mover: KVMover | None = None  # loads (the gpu-load lane and in-step loads)
        self._store_mover: KVMover | None = None  # stores (the gpu-store lane)
        self._load = Lane[QueuedJob]("gpu-load", self._run_job, fail_unreported)
        self._store = Lane[tuple[QueuedJob, ...]]("gpu-store", self._run_stores, _fail_all)
        self._ssd_write = Lane[QueuedJob]("ssd-write", self._run_job, fail_unreported)
        self._reads = LoadReads(self._load.submit)  # the ssd-read and remote-fetch lanes
        r = self._reads
        self._lanes = (self._load, self._store, self._ssd_write, r.ssd_read, r.fetch)
        self._guard = SlotGuard()  # CPU slots still read by write-backs and put copies
        self._jobs = Completions()  # every queued job's future, by request
        self._plan: TransferPlan | None = None
        self._submitted: set[JobKind] = set()
        self._pinned = False
        self._ssd: SSDCopier | None = None
        self._timer: StepTimer | None = None
        self._probe: LoadProbe | None = None  # reported once, with the first results
        self._step_loads = StepLoads({})
        self._step_reads: StepReads | None = None
        self._writes = True  # False: a replicated cache's rank > 0 (rank 0 writes its chunks)

    def register(
        self,
        kv_caches: Mapping[str, torch.Tensor],
        num_slots: int,
        blocks_per_chunk: int,
        setup: RankSetup | None = None,
        latent: bool = False,
    ) -> KVLayout:
        """Bind to vLLM's KV tensors; opens this rank's pool and SSD store (``setup``: which
        rank this is, whose bytes it writes, default rank 0 of 1; ``latent``: an MLA cache)."""
        setup = setup or RankSetup()
        io = open_rank_io(
            self.config, kv_caches, num_slots, blocks_per_chunk, setup, latent, self._remote
        )
        self.layout, self._pool, self._ssd = io.layout, io.pool, io.ssd
        self._mover, self._store_mover = io.mover, io.store_mover
        self._writes = setup.writes
        self._reads.bind(io.promoter, io.ssd, StagingRing(num_slots, io.staging))
        if io.ssd is not None and io.staging and setup.writes:  # a pool of this rank's own
            self._step_reads = StepReads(
                io.ssd, self._guard, io.pool.slot_bytes, io.layout.geometry
            )
        self._bind_step_loads(kv_caches)
        on_cuda = any(t.is_cuda for t in kv_caches.values())
        self._timer = StepTimer(next(iter(kv_caches.values())).device)
        self._pinned = on_cuda and pinning.pin(self._pool.address, self._pool.nbytes)
        self._probe = probe_rank(self._mover, self.layout, num_slots, self._ssd, self._remote)
        for lane in self._lanes:
            lane.start()
        logger.info(
            "MiniFlex worker: %s layout, %d CPU slots and %d staging slots of %d bytes "
            "(%.2f GiB%s), chunk %d tokens",
            self.layout.name,
            num_slots,
            io.staging,
            self._pool.slot_bytes,
            self._pool.nbytes / 2**30,
            ", pinned" if self._pinned else "",
            self.layout.geometry.chunk_tokens,
        )
        return self.layout

    def _bind_step_loads(self, kv_caches: Mapping[str, torch.Tensor]) -> None:
        assert self._mover is not None
        names = {name: i for i, name in enumerate(kv_caches)}  # the movers' layer order
        self._step_loads = StepLoads(names, self._step_reads)

    # ---- plan execution ----
    def submit(self, plan: TransferPlan, kind: JobKind, before_forward: bool = True) -> None:
        """Queue the plan's jobs of one kind once; loads before forward, stores after it.

        Called on vLLM's thread. Idempotent per plan, so a hook that some vLLM
        versions skip on empty steps can be backed up by a later one. The
        mover's fence, taken here, orders the copies after the GPU work vLLM
        has queued so far (the forward that computed a store's blocks).
        SYNC/LAYERWISE loads are issued here, on this thread; ``before_forward``
        False (a hook that runs after the forward) reports them failed instead.
        """
        assert self._mover is not None, "register() first"
        if plan is not self._plan:
            if self._step_loads:
                self.finish_step_loads()  # a step whose forward was never reported
            self._plan, self._submitted = plan, set()
        if kind in self._submitted:
            return
        if kind is JobKind.STORE and JobKind.LOAD not in self._submitted:
            self.submit(plan, JobKind.LOAD)  # demotions and loads always go first
        self._submitted.add(kind)
        group = _GROUPS[kind]
        self._guard.prune()
        self._queue_jobs([job for job in plan.jobs if job.kind in group and not job.synchronous])
        if kind is JobKind.LOAD:  # after the demotions above hold their slots (SlotGuard)
            self._step_loads.issue(
                [job for job in plan.jobs if job.synchronous], self._mover, before_forward
            )
            if plan.full_graph and before_forward:
                self._step_loads.wait_all()  # a full graph skips wait_for_layer_load

    def _queue_jobs(self, jobs: list[TransferJob]) -> None:
        """Queue a plan's jobs on their lanes, each once the slots it writes are free."""
        if not jobs:
            return
        assert self._mover is not None
        fence, stores = self._mover.fence(), StoreBatch(self._store.submit)  # one copy
        for job in jobs:
            fut = self._jobs.track(job.req_id)
            puts = bool(job.puts) and self._remote is not None and self._writes
            groups = tuple(PutGroup(g, Future()) for g in put_groups(job.puts)) if puts else ()
            item = QueuedJob(job, fence, fut, puts=groups)
            if job.kind in (JobKind.DEMOTE, JobKind.CLEAR):
                self._guard.hold((c.cpu for c in job.demotions), fut)
                if not groups:
                    self._guard.hold((c.cpu for c in job.remote), fut)
                self._hold_puts(item)
                self._ssd_write.submit(item)
            elif job.reads or job.streams:  # read into slots once written back, then copy
                self._reads.submit_after(item, self._guard)
            elif job.kind is JobKind.STORE and job.req_id in self._step_loads.failed:
                fut.set_result(failed_result(job, TransferError(_OVER_FAILED), time.perf_counter()))
            elif job.kind is JobKind.STORE:
                self._guard.after({c.slot for c in job.chunks}, lambda i=item: stores.add(i))
                self._hold_puts(item)  # after: the store must not wait for its own copies
            else:
                self._load.submit(item)
        stores.close()

    def _hold_puts(self, item: QueuedJob) -> None:
        """Register each group of the job's puts against its slots until it is copied."""
        for group in item.puts:
            self._guard.hold((c.cpu for c in group.copies), group.copied)

    def wait_layer(self, layer_name: str) -> None:
        """Before attention layer ``layer_name`` runs: order it after this step's loads."""
        self._step_loads.wait_layer(layer_name)

    def finish_step_loads(self) -> None:
        """The step's forward is issued: wait for its in-step loads and report them.

        Their failed blocks are load errors of this step (vLLM recomputes them);
        they are never reported as finished-receiving (vLLM did not wait).
        """
        if not self._step_loads:
            return
        for res in self._step_loads.finish():
            self._jobs.add(res)

    def forward_started(self, plan: TransferPlan) -> None:
        """vLLM is about to run the forward of ``plan``'s step (timed for the cost model)."""
        if self._timer is not None and plan.timed:
            self._timer.start(plan.step)

    def forward_issued(self, plan: TransferPlan) -> None:
        if self._timer is not None:
            self._timer.stop(plan.step)

    def take_step_times(self) -> list[tuple[int, float]]:
        """``(step, forward seconds)`` of the steps timed since the last call."""
        return self._timer.take() if self._timer is not None else []

    def release_when_saved(self, plan: TransferPlan) -> None:
        """Report the plan's released requests as finished-sending once their stores are done."""
        self._jobs.release_when_done(plan.release)

    def in_flight(self, req_id: ReqId) -> int:
        """Jobs of this request queued or running (not yet done)."""
        return self._jobs.in_flight(req_id)

    def drain(self) -> None:
        """Block until every queued job is done, its puts' copies too (shutdown, tests)."""
        self._jobs.drain()
        self._guard.wait_all()

    def wait_for(self, req_ids: tuple[ReqId, ...]) -> None:
        """Block until every queued job of these requests is done (their blocks may be reused)."""
        self._jobs.wait_for(req_ids)

    def _run_job(self, item: QueuedJob) -> None:
        """A LOAD's copies (gpu-load), a DEMOTE or CLEAR (ssd-write)."""
        assert self._mover is not None
        item = started(item)
        ssd = self._ssd if self._writes else None
        job, fence, promoted = item.job, item.fence, item.promoted
        self._report(item, execute(job, fence, promoted, self._mover, ssd, self._writes))

    def _run_stores(self, items: tuple[QueuedJob, ...]) -> None:
        """A batch of stores, one copy (gpu-store)."""
        assert self._store_mover is not None
        for it, res in execute_stores(tuple(map(started, items)), self._store_mover, self._writes):
            self._report(it, res)

    def _report(self, item: QueuedJob, res: JobResult) -> None:
        """Resolve the job; hand its remote puts to the uploader, whose copy threads (not this
        one: the next store would wait) copy their slots, then resolve each group's future."""
        wall = time.perf_counter() - item.queued_at
        res = replace(res, wall_seconds=wall, wait_seconds=waited(item))
        item.done.set_result(res)
        if not item.puts:
            return
        assert self._remote is not None
        groups = [(g.copies, resolver(g.copied, res)) for g in item.puts]
        try:
            self._remote.finished(item.job, res, groups)
        except Exception as exc:  # the worker boundary: the puts are lost, nothing else
            logger.error("MiniFlex: the puts of job %d were not queued: %s", item.job.job_id, exc)
            for _, done in groups:
                done()

    def take_thread_cpu(self) -> float:
        """CPU seconds MiniFlex's lanes spent on jobs since the last call (waits excluded)."""
        return sum(lane.take_cpu() for lane in self._lanes)

    def take_put_outcome(self) -> PutOutcome:
        """What this rank's remote puts came to since the last call."""
        return self._remote.take_outcome() if self._remote is not None else PutOutcome()

    # ---- completion reporting ----
    def poll(self) -> tuple[set[str], set[str]]:
        """Collect finished jobs: (finished_sending, finished_recving) request ids for vLLM."""
        return self._jobs.poll()

    def take_probe(self) -> LoadProbe | None:
        """The start-up load probe (:mod:`miniflex.worker.probe`), once."""
        out, self._probe = self._probe, None
        return out

    def take_results(self) -> list[JobResult]:
        return self._jobs.take_results()

    def take_load_errors(self) -> tuple[set[BlockId], set[ReqId]]:
        """The blocks of the loads that failed since the last call, and their requests."""
        return self._jobs.take_load_errors()

    def shutdown(self) -> None:
        self.finish_step_loads()
        if self._pool is not None:  # registered: the lanes run
            self.drain()
            for lane in self._lanes:
                lane.close()
            if self._pinned:
                pinning.unpin(self._pool.address)
            self._pool.close()
            self._pool = None
        if self._ssd is not None:
            self._ssd.close()
            self._ssd = None
        if self._remote is not None:
            self._remote.close()
            self._remote = None


def _fail_all(items: tuple[QueuedJob, ...], exc: Exception) -> None:
    for item in items:
        fail_unreported(item, exc)
