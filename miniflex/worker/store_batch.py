"""A plan's stores, copied by the gpu-store lane in one mover call.

A plan holds one STORE job per request that completed a chunk in its step: a
decode step of 32 requests that each fill a chunk makes 32 jobs of one chunk.
Every ``KVMover.store`` call has a fixed cost on the gpu-store lane (page table,
launches, events, copies, the wait), so one call of 32 chunks costs far less CPU
than 32 calls of one (docs/benchmarks.md, "Components", "what a store costs vLLM's
thread"); that CPU is taken from vLLM's thread, which waits for the interpreter
lock meanwhile. So the handler queues the stores of one
``submit`` whose slots are free as one batch (:class:`StoreBatch`), and
:func:`execute_stores` copies the batch in one call and reports each job on its
own. A store that must wait for its slots
(:class:`~miniflex.worker.slot_guard.SlotGuard`) is queued alone when they are free.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from miniflex.gpu.base import KVMover
from miniflex.plan import JobKind, JobResult
from miniflex.worker.job_runner import QueuedJob, failed_result

__all__ = ["StoreBatch", "execute_stores"]


class StoreBatch:
    """Collects the store items of one ``submit`` call until :meth:`close`, which queues
    them as one batch; an item added after that (a store whose slots were read by
    background work until now, on that work's thread) is queued as a batch of its own."""

    def __init__(self, put: Callable[[tuple[QueuedJob, ...]], None]) -> None:
        self._put = put
        self._items: list[QueuedJob] = []
        self._open = True
        self._lock = threading.Lock()

    def add(self, item: QueuedJob) -> None:
        with self._lock:
            if self._open:
                self._items.append(item)
                return
        self._put((item,))

    def close(self) -> None:
        with self._lock:
            self._open = False
            items, self._items = tuple(self._items), []
        if items:
            self._put(items)


def execute_stores(
    items: Sequence[QueuedJob], mover: KVMover, writes: bool = True
) -> list[tuple[QueuedJob, JobResult]]:
    """Copy the chunks of every store in ``items`` with one ``mover.store``; each item with
    its result, in order. The items come from one plan, so they share its fence (a later fence
    would cover the earlier ones' GPU work anyway: the last is used). A failed copy fails
    every job of the batch (their chunks are simply not stored). ``writes`` False: a rank
    that does not write its cache's bytes, every job done at once."""
    t0 = time.perf_counter()
    chunks = [c for it in items for c in it.job.chunks]
    moved = 0
    try:
        if writes and chunks:
            # Issue only once the forward that computed the blocks is done: the issue needs
            # the interpreter lock, which vLLM's thread needs while it queues the step's
            # sampling, and then waits for the GPU without it.
            mover.wait_for(items[-1].fence)
            t0 = time.perf_counter()  # the copy's time, not the forward's
            moved = mover.store(chunks, after=items[-1].fence)
    except Exception as exc:  # the worker boundary: report, never crash vLLM
        return [(it, failed_result(it.job, exc, t0)) for it in items]
    seconds = time.perf_counter() - t0
    out = []
    for it in items:
        share = len(it.job.chunks) / len(chunks) if chunks else 0.0
        job = it.job
        res = JobResult(
            job.job_id, job.req_id, JobKind.STORE, True, round(moved * share), seconds * share
        )
        out.append((it, res))
    return out
