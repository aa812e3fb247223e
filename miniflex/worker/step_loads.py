"""Loads inside a step: issued on vLLM's thread before the forward, waited for per layer.

A SYNC or LAYERWISE load job (``miniflex.plan.LoadTiming``) fills blocks that
this very step's forward reads, so it cannot go through the gpu-load lane.
On one worker, per engine step, all on vLLM's thread:

1. ``issue`` (from ``start_load_kv``, before the forward): one
   ``KVMover.load_layerwise`` per job, after the mover's fence. A job that
   cannot even be queued becomes a failed result (its blocks load errors).
2. ``wait_layer`` (from ``wait_for_layer_load``, before each attention
   layer): LAYERWISE jobs order the layer after its own copy; SYNC jobs wait
   for every layer at the first attention layer (load-then-compute). A step
   that may replay a full CUDA graph (``TransferPlan.full_graph``) calls no
   hook inside its forward: ``wait_all`` orders it after every layer at once,
   right after ``issue``.
3. ``finish`` (from ``wait_for_save``, or ``get_finished`` where vLLM defers
   the former): waits for the copies and returns one ``JobResult`` per job.

If the forward did not wait for every layer of a load still in flight (a
backend that never calls ``wait_for_layer_load``), the layers may have been
read before their copy: the job's blocks are reported as load errors, so vLLM
recomputes them instead of keeping a wrong result.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from miniflex.errors import TransferError
from miniflex.gpu.base import DoneLoad, KVMover, LayerwiseLoad
from miniflex.plan import JobResult, LoadTiming, TransferJob
from miniflex.types import ReqId
from miniflex.worker.job_runner import unread
from miniflex.worker.step_reads import DiskRead, StepReads

__all__ = ["StepLoads"]

logger = logging.getLogger(__name__)

_UNWAITED = "the forward did not wait for every layer's copy"


@dataclass
class _Issued:
    job: TransferJob
    load: LayerwiseLoad | None  # None: failed at issue
    started: float
    issue_seconds: float
    error: str = ""
    waited: set[int] = field(default_factory=set)  # layers the forward waited for
    read: DiskRead | None = None  # its SSD reads (promotions), in flight


class StepLoads:
    """The in-step loads of the step being computed on one worker (vLLM's thread only)."""

    def __init__(self, layer_names: Mapping[str, int], reads: StepReads | None = None) -> None:
        """``layer_names``: vLLM's layer name -> index, in KV cache registration order;
        ``reads``: this worker's in-step SSD reads (None: a load that promotes fails)."""
        self._layers = dict(layer_names)
        self._reads = reads
        self.failed: set[ReqId] = set()
        """Requests whose in-step load of the last finished step failed in part or whole:
        what that step computed for them read bytes that never arrived."""
        self._issued: list[_Issued] = []
        self._waited_all = False
        self._warned = False

    def __bool__(self) -> bool:
        return bool(self._issued)

    def issue(self, jobs: list[TransferJob], mover: KVMover, before_forward: bool) -> None:
        """Queue ``jobs`` (SYNC/LAYERWISE loads), once per step. ``before_forward=False``:
        the forward has already run, so the loads are reported failed without touching the
        blocks."""
        self.failed = set()
        if not jobs:
            return
        fence = mover.fence() if before_forward else None
        for job in jobs:
            t0 = time.perf_counter()
            if not before_forward:
                self._issued.append(_Issued(job, None, t0, 0.0, "issued after the forward"))
                continue
            read = None
            try:
                if job.promotions:
                    if self._reads is None:
                        raise TransferError("this worker cannot read from SSD inside a step")
                    read = self._reads.start(job)
                gate = read.gate if read is not None else None
                load = mover.load_layerwise(job.chunks, after=fence, gate=gate)
            except Exception as exc:  # the worker boundary: report, never crash vLLM
                self._issued.append(_Issued(job, None, t0, 0.0, str(exc), read=read))
                continue
            self._issued.append(_Issued(job, load, t0, time.perf_counter() - t0, read=read))

    def wait_layer(self, layer_name: str) -> None:
        """Before attention layer ``layer_name`` reads its KV cache."""
        if not self._issued or self._waited_all:
            return
        index = self._layers.get(layer_name)
        for it in self._issued:
            if it.load is None:
                continue
            if index is None or it.job.timing is LoadTiming.SYNC:
                self._wait_all(it)  # an unknown layer: assume it reads every layer
            elif index not in it.waited:
                self._wait(it, index)
        self._waited_all = index is None or all(
            it.load is None or len(it.waited) == len(self._layers) for it in self._issued
        )

    def wait_all(self) -> None:
        """Order the forward after every layer of every load now, before it starts: for a
        step that may replay a full CUDA graph, which calls no ``wait_layer`` at all."""
        for it in self._issued:
            if it.load is not None:
                self._wait_all(it)
        self._waited_all = True

    def _wait_all(self, it: _Issued) -> None:
        assert it.load is not None
        for layer in range(len(self._layers)):
            if layer not in it.waited:
                self._wait(it, layer)

    def _wait(self, it: _Issued, layer: int) -> None:
        """Order the forward after ``layer`` of ``it``; a load that cannot be waited for
        (its copy failed to queue) fails, and the forward goes on (vLLM recomputes)."""
        assert it.load is not None
        it.waited.add(layer)
        if it.error:
            return
        try:
            it.load.wait_layer(layer)
        except Exception as exc:  # the worker boundary: never crash vLLM's forward
            it.error = str(exc)

    def finish(self) -> list[JobResult]:
        """Wait for every load of the step; their results (failed blocks included)."""
        out = [self._finish(it) for it in self._issued]
        self.failed = {r.req_id for r in out if not r.ok or r.failed_block_ids}
        self._issued, self._waited_all = [], False
        return out

    def _finish(self, it: _Issued) -> JobResult:
        job = it.job
        error = it.error
        moved = 0
        seconds = it.issue_seconds
        if it.load is not None:
            t0 = time.perf_counter()
            try:
                moved = it.load.wait()
            except Exception as exc:  # the worker boundary: report, never crash vLLM
                error = error or str(exc)
            if not isinstance(it.load, DoneLoad):
                # Copies overlapped the forward: from issue to done (an upper bound).
                seconds = time.perf_counter() - it.started
            else:
                seconds += time.perf_counter() - t0
            unwaited = len(it.waited) < len(self._layers)
            if not error and unwaited and not isinstance(it.load, DoneLoad):
                error = _UNWAITED
        bad, ssd_s = set(), 0.0
        if it.read is not None:  # its slots are written until the reads end, whatever failed
            bad, ssd_s, read_error = it.read.join()
            error = error or read_error
        if error:
            self._log_failure(job, error)
            failed = (*job.block_ids, *job.unavailable)
            return JobResult(
                job.job_id, job.req_id, job.kind, False, 0, seconds, failed, tuple(bad)
            )
        _, lost = unread(job, bad)
        io = self._reads.io if self._reads is not None and job.promotions else ""
        return JobResult(
            job.job_id,
            job.req_id,
            job.kind,
            True,
            moved,
            seconds,
            (*lost, *job.unavailable),
            tuple(bad),
            io,
            ssd_s,
        )

    def _log_failure(self, job: TransferJob, error: str) -> None:
        if error != _UNWAITED or not self._warned:  # a backend's habit: say it once
            logger.error(
                "MiniFlex %s load %d of %s failed: %s; vLLM recomputes its blocks",
                job.timing.value,
                job.job_id,
                job.req_id,
                error,
            )
            self._warned = self._warned or error == _UNWAITED
