"""One transfer job run on a worker thread, turned into the ``JobResult`` it reports.

Called by :class:`~miniflex.worker.handler.MiniFlexHandler`'s threads in plan
order. Any exception is caught here and reported as a failed job (a failed
load's blocks become load errors, so vLLM recomputes them): the worker boundary.
A rank that does not write its cache's bytes (a replicated cache's rank > 0)
runs SSD writes as no-ops and reports them done. Stores are not run here: the
gpu-store lane copies a plan's stores in one call (``store_batch.py``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field, replace

from miniflex.errors import TransferError
from miniflex.gpu.base import KVMover
from miniflex.plan import JobKind, JobResult, RemoteCopy, TransferJob
from miniflex.ssd.copier import SSDCopier
from miniflex.types import BlockId, ChunkKey, SlotId

__all__ = [
    "Promoted",
    "PutGroup",
    "QueuedJob",
    "execute",
    "fail_unreported",
    "failed_result",
    "io_of",
    "resolver",
    "started",
    "waited",
]

logger = logging.getLogger(__name__)

Promoted = tuple[set[ChunkKey], float, float]
"""A load's reads, done before its copies: keys that failed, seconds of the SSD reads and of
the remote fetches."""


@dataclass(frozen=True)
class PutGroup:
    """One hand-off of a job's remote puts (:func:`~miniflex.remote.tier.put_groups`) and
    the future resolved once the uploader has copied their slots."""

    copies: tuple[RemoteCopy, ...]
    copied: Future[JobResult]


@dataclass(frozen=True)
class QueuedJob:
    """A job on its way through the worker's threads."""

    job: TransferJob
    fence: object
    """The mover's marker: the job's copies wait for the GPU work vLLM queued before it."""
    done: Future[JobResult]
    """Resolved with the job's report when it has run (or failed)."""
    promoted: Promoted | None = None
    """A load's SSD reads and remote fetches, once they are done (None: not yet, or none)."""
    queued_at: float = field(default_factory=time.perf_counter)
    """When the job's plan reached the worker (``JobResult.wall_seconds`` counts from it)."""
    started_at: float = 0.0
    """When a lane first started it (0: not yet; ``JobResult.wait_seconds`` ends there)."""
    puts: tuple[PutGroup, ...] = ()
    """A job with remote puts (STORE, DEMOTE): its puts in groups, each done once its slots
    are copied for the puts, on one of the uploader's copy threads (the job itself is
    reported before that, see :class:`~miniflex.worker.slot_guard.SlotGuard`); empty
    without puts."""


def started(item: QueuedJob) -> QueuedJob:
    """``item`` stamped as started now, unless a lane started it before."""
    return item if item.started_at else replace(item, started_at=time.perf_counter())


def waited(item: QueuedJob) -> float:
    """Seconds from ``item`` reaching the worker to a lane starting it (0: not started)."""
    return max(0.0, item.started_at - item.queued_at) if item.started_at else 0.0


def resolver(future: Future[JobResult], res: JobResult) -> Callable[[], None]:
    """A callback that resolves ``future`` with ``res`` (once: later calls do nothing)."""

    def resolve() -> None:
        with contextlib.suppress(InvalidStateError):  # resolved already, on another thread
            future.set_result(res)

    return resolve


def failed_result(job: TransferJob, exc: Exception, t0: float, io: str = "") -> JobResult:
    """The report of a job that raised: nothing usable moved (a load: all its blocks failed)."""
    logger.error("MiniFlex %s job %d of %s failed: %s", job.kind.value, job.job_id, job.req_id, exc)
    failed = (*job.block_ids, *job.unavailable) if job.kind is JobKind.LOAD else ()
    return JobResult(
        job.job_id, job.req_id, job.kind, False, 0, time.perf_counter() - t0, failed, io=io
    )


def fail_unreported(item: QueuedJob, exc: Exception) -> None:
    """Report a job whose lane's run raised (a bug) failed, unless it was reported, so that
    nothing waits for it forever."""
    if not item.done.done():
        res = failed_result(item.job, exc, time.perf_counter())
        item.done.set_result(res)
        for group in item.puts:  # never handed to the uploader: nothing reads the slots
            resolver(group.copied, res)()


def io_of(job: TransferJob, ssd: SSDCopier | None) -> str:
    """The SSD I/O backend to report for ``job`` (``JobResult.io``): empty unless it
    touches SSD."""
    return ssd.backend if ssd is not None and job.touches_ssd else ""


def unread(job: TransferJob, failed_keys: set[ChunkKey]) -> tuple[set[SlotId], list[BlockId]]:
    """The CPU slots of ``job``'s reads whose key failed, and the blocks loaded from them."""
    bad = {c.cpu for c in job.reads if c.key in failed_keys}
    return bad, [b for c in job.chunks if c.slot in bad for b in c.block_ids]


def execute(
    job: TransferJob,
    fence: object,
    promoted: Promoted | None,
    mover: KVMover,
    ssd: SSDCopier | None,
    writes: bool = True,
) -> JobResult:
    """Run a LOAD, DEMOTE or CLEAR job; a load's SSD reads were done before (``promoted``).
    STORE jobs go through :func:`~miniflex.worker.store_batch.execute_stores`."""
    t0 = time.perf_counter()
    io = io_of(job, ssd)
    ssd_seconds = remote_seconds = 0.0
    try:
        failed_keys: set[ChunkKey] = set()
        failed_blocks: list[BlockId] = list(job.unavailable)
        moved = 0
        if job.kind is JobKind.LOAD:
            chunks = job.chunks
            if promoted is not None:
                failed_keys, ssd_seconds, remote_seconds = promoted
                t0 -= ssd_seconds + remote_seconds  # the reads, not the waits around them
                bad, lost = unread(job, failed_keys)
                chunks = tuple(c for c in chunks if c.slot not in bad)
                failed_blocks += lost
            moved = mover.load(chunks, after=fence) if chunks else 0
        elif job.kind is JobKind.DEMOTE and writes and job.demotions:
            failed_keys = _copier(ssd).demote(job.demotions)
            moved = (len(job.demotions) - len(failed_keys)) * _copier(ssd).store.slot_bytes
        elif job.kind is JobKind.CLEAR and ssd is not None:
            ssd.clear()
    except Exception as exc:  # the worker boundary: report, never crash vLLM
        return failed_result(job, exc, t0, io)
    return JobResult(
        job.job_id,
        job.req_id,
        job.kind,
        True,
        moved,
        time.perf_counter() - t0,
        tuple(failed_blocks),
        tuple(failed_keys),
        io,
        ssd_seconds,
        remote_seconds,
    )


def _copier(ssd: SSDCopier | None) -> SSDCopier:
    if ssd is None:
        raise TransferError("an SSD job reached a worker without ssd_dirs configured")
    return ssd
