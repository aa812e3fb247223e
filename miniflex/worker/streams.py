"""Loads that stream: chunks read into staging slots and copied to the GPU in parts.

A load whose SSD or remote chunks do not all fit the CPU tier carries them as
``TransferJob.streams``: each names a staging slot, one of the pool's slots past
the CPU tier's (:func:`miniflex.pool.stream_slots`), which the scheduler hands
out in turn. On the ssd-read lane (the remote-fetch lane, for a load that reads
nothing from SSD), :class:`Streamer` runs such a job in parts:

1. the chunks in CPU slots (resident ones, promotions and fetches, read first) go
   to the gpu-load lane as one copy;
2. the streamed chunks are read a window at a time (half the staging slots), SSD
   chunks from the disk and remote ones from the store (:class:`Promoter`), and
   each window's copy goes to the gpu-load lane as soon as it has arrived, so the
   next window is read while the GPU copies this one; on the ssd-read lane, the
   trailing remote streams (those after the last SSD one) go to the remote-fetch lane
   as a part of their own, read there beside the SSD windows;
3. a staging slot is read into again only once the copy out of it is done
   (:class:`StagingRing`), whichever job it belonged to.

:class:`StreamedLoad` adds the parts up into the job's one ``JobResult``, once
the last part is copied. A chunk that fails its read is left out of its window's
copy and its blocks become load errors; a part that fails fails the job, as a
failed copy does in a load of one part. Every staging slot is freed again
however its part ended.

Example: 6 streamed chunks over 4 staging slots (slots 10-13 of a 10-slot tier)
are read as windows {10, 11}, {12, 13}, {10, 11}; the third waits for the first
window's copy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace

from miniflex.errors import TransferError
from miniflex.plan import ChunkMove, JobKind, JobResult, RemoteCopy, SlotCopy, TransferJob
from miniflex.ssd.copier import SSDCopier
from miniflex.types import BlockId, ChunkKey, SlotId
from miniflex.worker.fetch_handoff import Handoff
from miniflex.worker.job_runner import Promoted, QueuedJob, io_of, waited
from miniflex.worker.promotions import Promoter

__all__ = ["StagingRing", "StreamedLoad", "Streamer"]

logger = logging.getLogger(__name__)


class StagingRing:
    """The pool's staging slots ``[first, first + count)``: each is free, or holds a chunk
    whose GPU copy is not done yet. The read lanes that run streamed windows (ssd-read,
    remote-fetch) claim, the gpu-load lane frees. Every load numbers its staging slots
    from the ring's start, so two lanes may want the same slots at once: a window is
    claimed whole, under one lock, once every slot of it is free."""

    def __init__(self, first: int, count: int) -> None:
        self.first, self.count = first, count
        self._held: set[int] = set()
        self._changed = threading.Condition()

    def __contains__(self, slot: int) -> bool:
        return self.first <= slot < self.first + self.count

    def claim(self, slots: Sequence[SlotId]) -> None:
        """Wait until every slot's last copy is done, then hold them all at once (a read
        lane); slots are checked to be staging slots, and distinct, before any is held."""
        assert all(slot in self for slot in slots), f"not all staging slots: {slots}"
        assert len(set(slots)) == len(slots), f"a staging slot twice in one window: {slots}"
        with self._changed:
            self._changed.wait_for(lambda: self._held.isdisjoint(slots))
            self._held.update(slots)

    def free(self, slots: Sequence[SlotId]) -> None:
        with self._changed:
            self._held.difference_update(slots)
            self._changed.notify_all()

    def idle(self) -> bool:
        """No staging slot is held (tests, shutdown)."""
        with self._changed:
            return not self._held


class StreamedLoad:
    """One LOAD job's result, added up from its parts; resolves ``done`` after the last.

    The ssd-read lane holds one part open until it has queued every part
    (:meth:`close`), so the job cannot finish between two parts.
    """

    def __init__(
        self,
        job: TransferJob,
        done: Future[JobResult],
        io: str,
        queued_at: float = 0.0,
        waited: float | None = 0.0,
    ) -> None:
        """``queued_at``: when the job reached the worker (its ``wall_seconds`` start);
        ``waited``: its ``wait_seconds``, before a lane started it (None: the longest of its
        parts', for a job whose parts were queued apart, see :meth:`Streamer.split`: the
        wait of its reads for their slots)."""
        self._job, self._done, self._io, self._queued_at = job, done, io, queued_at
        self._waited = waited
        self._part_waits: list[float] = []
        self._lock = threading.Lock()
        self._open = 1
        self._ok = True
        self._bytes = 0
        self._copy_s = self._ssd_s = self._remote_s = 0.0
        self._failed_blocks: list[BlockId] = []
        self._failed_keys: set[ChunkKey] = set()

    def expect(self) -> None:
        """A part was queued."""
        with self._lock:
            self._open += 1

    def read(self, window: Promoted) -> None:
        """A window's reads: the keys that failed, the seconds of its SSD reads and of its
        remote fetches."""
        failed, ssd_s, remote_s = window
        with self._lock:
            self._failed_keys |= failed
            self._ssd_s += ssd_s
            self._remote_s += remote_s

    def part(self, res: JobResult) -> None:
        """A part's copy is done (the gpu-load lane), or failed."""
        with self._lock:
            self._ok = self._ok and res.ok
            self._bytes += res.num_bytes
            self._copy_s += res.copy_seconds
            self._ssd_s += res.ssd_seconds
            self._remote_s += res.remote_seconds
            self._failed_blocks += res.failed_block_ids
            self._failed_keys.update(res.failed_keys)
            self._part_waits.append(res.wait_seconds)
        self._close_one()

    def close(self) -> None:
        """The ssd-read lane has queued every part."""
        self._close_one()

    def _close_one(self) -> None:
        with self._lock:
            self._open -= 1
            if self._open:
                return
        job = self._job
        self._done.set_result(
            JobResult(
                job.job_id,
                job.req_id,
                JobKind.LOAD,
                self._ok,
                self._bytes,
                self._copy_s + self._ssd_s + self._remote_s,
                tuple(self._failed_blocks),
                tuple(self._failed_keys),
                self._io,
                self._ssd_s,
                self._remote_s,
                time.perf_counter() - self._queued_at if self._queued_at else 0.0,
                self._waited if self._waited is not None else max(self._part_waits, default=0),
            )
        )


class Streamer:
    """Runs the streamed part of LOAD jobs on the ssd-read lane (see the module docstring)."""

    def __init__(
        self,
        ssd: SSDCopier | None,
        ring: StagingRing,
        to_load_thread: Callable[[QueuedJob], None],
        promoter: Promoter | None = None,
        to_fetch_lane: Callable[[QueuedJob], None] | None = None,
    ) -> None:
        """``promoter``: reads a window (SSD reads, remote fetches; None: this rank's SSD
        store alone). ``to_fetch_lane``: runs a load that reads nothing from SSD (the
        remote-fetch lane; None: the remote windows of a load that also reads from SSD run
        after its SSD windows, on the same lane)."""
        self._ssd, self._ring, self._put = ssd, ring, to_load_thread
        self._promoter = promoter or Promoter(ssd, None, True)
        self._to_fetch_lane = to_fetch_lane

    @property
    def window(self) -> int:
        """Chunks read at once: half the ring, so one window is read while another copies."""
        return max(1, self._ring.count // 2)

    def run(self, item: QueuedJob, promoted: Promoted | None, fetch: bool = False) -> None:
        """Queue ``item``'s copies part by part; its CPU-slot reads (``promoted``) are done,
        or, with ``fetch`` (a load that reads nothing from SSD), its fetches into CPU slots
        run here, each group handed to the GPU copy as it arrives (:class:`Handoff`).
        Never raises: a window that cannot be read fails the job, and the chunks not queued
        by then are load errors (vLLM recomputes them)."""
        job = item.job
        load = StreamedLoad(job, item.done, io_of(job, self._ssd), item.queued_at, waited(item))
        unsent: tuple[ChunkMove, ...] = job.chunks  # not handed to the gpu-load lane yet
        handoff: Handoff | None = None
        try:
            rest = self._streamed(job)
            fetched = {c.cpu for c in job.remote} if fetch else set()
            held = tuple(
                m for m in job.chunks if m.slot not in self._ring and m.slot not in fetched
            )
            head = replace(job, chunks=held, streams=())  # resident (and read) chunks
            self._queue(item, head, load, promoted, ())
            unsent = tuple(m for _, m in rest)
            if fetch:
                handoff = Handoff(job.chunks, job.remote, lambda *p: self._part(item, load, *p))
                read = self._promoter.promote(job.job_id, (), job.remote, handoff.arrived)
                load.read(read)
                handoff.flush(read[0])
                handoff = None
            else:  # the remote windows after the SSD ones go to the remote-fetch lane
                rest = self._hand_over_fetches(item, load, rest)
                unsent = tuple(m for _, m in rest)
            for i in range(0, len(rest), self.window):
                self._window(item, load, rest[i : i + self.window])
                unsent = unsent[self.window :]
        except Exception as exc:  # the worker boundary: what was not sent is recomputed
            logger.error("MiniFlex streamed load %d of %s failed: %s", job.job_id, job.req_id, exc)
            if handoff is not None:  # the fetches raised
                unsent = handoff.close() + unsent
            lost = [b for m in unsent for b in m.block_ids]
            if unsent is job.chunks:  # nothing was sent: the job's unavailable blocks too
                lost += job.unavailable
            load.expect()  # the rest, reported failed as one part
            load.part(JobResult(job.job_id, job.req_id, JobKind.LOAD, False, 0, 0.0, tuple(lost)))
        finally:
            load.close()

    def split(self, item: QueuedJob) -> tuple[QueuedJob, QueuedJob] | None:
        """``item``, a load with reads into CPU slots and streamed chunks, as two loads
        queued apart: its reads with the chunks in CPU slots, then its streamed chunks, each
        a part of ``item``'s one result (resolved once both are done). The handler queues
        the streamed part at once when the slots the reads write into are still busy.
        None: the job's moves from staging slots do not match its streams (it runs whole,
        and :meth:`run` reports it failed)."""
        job = item.job
        try:
            staged = tuple(m for _, m in self._streamed(job))
        except TransferError:
            return None
        held = tuple(m for m in job.chunks if m.slot not in self._ring)
        head = replace(job, chunks=held, streams=())
        tail = replace(job, chunks=staged, promotions=(), remote=(), unavailable=())
        load = StreamedLoad(job, item.done, io_of(job, self._ssd), item.queued_at, waited=None)
        parts = []
        for sub in (head, tail):
            part: Future[JobResult] = Future()
            part.add_done_callback(lambda fut: load.part(fut.result()))
            load.expect()
            parts.append(QueuedJob(sub, item.fence, part, queued_at=item.queued_at))
        load.close()  # resolves ``item.done`` once both parts are
        return parts[0], parts[1]

    def _hand_over_fetches(
        self,
        item: QueuedJob,
        load: StreamedLoad,
        rest: list[tuple[SlotCopy | RemoteCopy, ChunkMove]],
    ) -> list[tuple[SlotCopy | RemoteCopy, ChunkMove]]:
        """Queue the trailing run of remote streams as a load of its own on the remote-fetch
        lane, one part of ``load``, so that a store that stalls never holds up the disk
        reads of other requests queued behind this one; returns the streams left here.
        The two parts claim their staging windows in turn, as two loads would."""
        cut = len(rest)
        while cut and isinstance(rest[cut - 1][0], RemoteCopy):
            cut -= 1
        if cut == len(rest) or self._to_fetch_lane is None:
            return rest
        tail = rest[cut:]
        sub = replace(
            item.job,
            chunks=tuple(m for _, m in tail),
            streams=tuple(c for c, _ in tail),
            promotions=(),
            remote=(),
            unavailable=(),
        )
        part: Future[JobResult] = Future()
        part.add_done_callback(lambda fut: load.part(fut.result()))
        load.expect()
        self._to_fetch_lane(QueuedJob(sub, item.fence, part))
        return rest[:cut]

    def _part(
        self,
        item: QueuedJob,
        load: StreamedLoad,
        moves: tuple[ChunkMove, ...],
        lost: tuple[BlockId, ...],
    ) -> None:
        """Queue the copy of chunks that arrived in CPU slots (``lost``: blocks of those
        that did not, load errors)."""
        self._queue(item, _copy_of(item.job, moves, lost), load, None, ())

    def _streamed(self, job: TransferJob) -> list[tuple[SlotCopy | RemoteCopy, ChunkMove]]:
        """Each stream with its chunk's move into vLLM's blocks; TransferError where this
        worker cannot run them (staging slots not as the plan numbers them; a window's read
        raises it where this rank has no SSD store or remote store to read from)."""
        staged = [m for m in job.chunks if m.slot in self._ring]
        outside = [c.cpu for c in job.streams if c.cpu not in self._ring]
        if len(staged) != len(job.streams) or outside:
            raise TransferError(
                f"{len(job.streams)} streamed chunks, {len(staged)} moves from staging slots "
                f"{self._ring.first}-{self._ring.first + self._ring.count - 1}, slots outside: "
                f"{outside[:4]}"
            )
        return list(zip(job.streams, staged, strict=True))

    def _window(
        self,
        item: QueuedJob,
        load: StreamedLoad,
        part: list[tuple[SlotCopy | RemoteCopy, ChunkMove]],
    ) -> None:
        """Read one window into its staging slots, then queue its copy."""
        copies = [c for c, _ in part]
        slots = [c.cpu for c in copies]
        self._ring.claim(slots)
        try:
            reads = [c for c in copies if isinstance(c, SlotCopy)]
            fetches = [c for c in copies if isinstance(c, RemoteCopy)]
            window = self._promoter.promote(item.job.job_id, reads, fetches)
            load.read(window)
            failed = window[0]
        except BaseException:
            self._ring.free(slots)
            raise
        good = tuple(m for c, m in part if c.key not in failed)
        lost = tuple(b for c, m in part if c.key in failed for b in m.block_ids)
        self._queue(item, _copy_of(item.job, good, lost), load, None, slots)

    def _queue(
        self,
        item: QueuedJob,
        sub: TransferJob,
        load: StreamedLoad,
        promoted: Promoted | None,
        slots: Sequence[SlotId],
    ) -> None:
        """Hand one part to the gpu-load lane; its staging ``slots`` are freed when it is done."""
        part: Future[JobResult] = Future()

        def done(fut: Future[JobResult]) -> None:
            self._ring.free(slots)
            load.part(fut.result())

        part.add_done_callback(done)
        load.expect()
        self._put(QueuedJob(sub, item.fence, part, promoted=promoted))


def _copy_of(
    job: TransferJob, moves: tuple[ChunkMove, ...], lost: tuple[BlockId, ...]
) -> TransferJob:
    """The part of ``job`` that copies ``moves`` (their reads done), with ``lost`` (blocks
    whose read failed) as its load errors."""
    return replace(job, chunks=moves, unavailable=lost, promotions=(), remote=(), streams=())
