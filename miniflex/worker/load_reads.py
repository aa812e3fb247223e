"""A LOAD's reads, chained over the remote-fetch and ssd-read lanes, then its GPU copies.

A load whose chunks are not all in CPU slots reads them first: remote fetches
into the slots the scheduler allocated, SSD promotions into others, and chunks
past the CPU tier through staging slots (``streams.py``). Each medium has its own
lane (``lanes.py``), and the job goes from one to the next, skipping a lane it has
nothing for::

    remote-fetch ──► ssd-read ──► gpu-load
         └───────────────────────────▲      (no SSD reads)

A load that reads nothing from SSD runs whole on the remote-fetch lane, so that it
never waits behind another request's disk reads: its fetches into CPU slots are handed
to the GPU copy in groups as they arrive (``fetch_handoff.py``), then its streamed
windows follow. A load that reads from SSD runs its SSD windows on the ssd-read lane and
hands the trailing remote ones back to the remote-fetch lane, as a part of its own, so
that a stalled store never holds up other requests' disk reads.

Each lane adds what it read to the job's :data:`Promoted` (failed keys, SSD
seconds, remote seconds). A failed key's blocks become load errors; reads
that raise fail the job, and the blocks not copied by then become load errors
too (vLLM recomputes them). A job is queued here once every slot it reads into is
free (:meth:`LoadReads.submit_after`, :class:`~miniflex.worker.slot_guard.SlotGuard`); its
streamed chunks, which touch no such slot, go at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from miniflex.plan import RemoteCopy, SlotCopy
from miniflex.ssd.copier import SSDCopier
from miniflex.worker.job_runner import (
    Promoted,
    QueuedJob,
    fail_unreported,
    failed_result,
    io_of,
    started,
)
from miniflex.worker.lanes import Lane
from miniflex.worker.promotions import Promoter
from miniflex.worker.slot_guard import SlotGuard
from miniflex.worker.streams import StagingRing, Streamer

__all__ = ["LoadReads"]


class LoadReads:
    """The remote-fetch and ssd-read lanes of one rank; :meth:`bind` before the first job."""

    def __init__(self, to_gpu: Callable[[QueuedJob], None]) -> None:
        """``to_gpu``: queues a job whose reads are done for its GPU copies (gpu-load)."""
        self._to_gpu = to_gpu
        self.fetch = Lane[QueuedJob]("remote-fetch", self._run_fetch, fail_unreported)
        self.ssd_read = Lane[QueuedJob]("ssd-read", self._run_ssd_read, fail_unreported)
        self._ssd: SSDCopier | None = None
        self._promoter = Promoter(None, None, True)
        self.streamer = Streamer(None, StagingRing(0, 0), to_gpu)

    def bind(self, promoter: Promoter, ssd: SSDCopier | None, ring: StagingRing) -> None:
        """This rank's readers: its promoter, SSD store and staging slots."""
        self._promoter, self._ssd = promoter, ssd
        self.streamer = Streamer(ssd, ring, self._to_gpu, promoter, self.fetch.submit)

    def submit(self, item: QueuedJob) -> None:
        """Read ``item``'s chunks, then queue its copies; its read slots are free."""
        job = item.job
        (self.fetch if job.remote or not job.touches_ssd else self.ssd_read).submit(item)

    def submit_after(self, item: QueuedJob, guard: SlotGuard) -> None:
        """Submit ``item`` once the CPU slots it reads into are free (``guard``); a load that
        also streams sends its streamed part at once if they are not, as a load of its own
        (:meth:`Streamer.split`): staging slots are no reader's, so that part never waits
        for the write-backs and put copies of slots it does not touch."""
        reads = {c.cpu for c in item.job.reads}
        if item.job.streams and reads and guard.busy(reads):
            parts = self.streamer.split(item)
            if parts is not None:
                self.submit(parts[1])  # the streamed chunks
                item = parts[0]
        guard.after(reads, lambda: self.submit(item))

    def _run_fetch(self, item: QueuedJob) -> None:
        item = started(item)
        job = item.job
        if not job.touches_ssd:  # fetched from the store alone: copies start as chunks arrive
            self.streamer.run(item, None, fetch=True)
            return
        if (fetched := self._read(item, (), job.remote)) is None:
            return
        self.ssd_read.submit(replace(item, promoted=fetched))

    def _run_ssd_read(self, item: QueuedJob) -> None:
        item = started(item)
        if (read := self._read(item, item.job.promotions, ())) is None:
            return
        if item.promoted is not None:  # its remote fetches, done before
            (f1, s1, r1), (f2, s2, r2) = item.promoted, read
            read = (f1 | f2, s1 + s2, r1 + r2)
        if item.job.streams:
            self.streamer.run(item, read)  # the copies go part by part
        else:
            self._to_gpu(replace(item, promoted=read))

    def _read(
        self, item: QueuedJob, copies: Sequence[SlotCopy], fetches: Sequence[RemoteCopy]
    ) -> Promoted | None:
        """One lane's share of the job's reads; None: they raised, and the job is reported
        failed."""
        job, t0 = item.job, time.perf_counter()
        try:
            return self._promoter.promote(job.job_id, copies, fetches)
        except Exception as exc:  # the worker boundary: report, never crash vLLM
            item.done.set_result(failed_result(job, exc, t0, io_of(job, self._ssd)))
            return None
