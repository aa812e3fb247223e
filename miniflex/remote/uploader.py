"""Write-through to the remote store, off every critical path: a bounded queue and two threads.

A job's puts (:attr:`TransferJob.remote`: a STORE's write-through, a DEMOTE's
write-back) are handed over with :meth:`RemoteUploader.offer_later` by the
job's thread once the job is reported (vLLM gets its blocks back without
waiting for any of this). A copy thread copies each slot's bytes into a buffer
of its own and calls the job's ``copied`` callback: the worker holds jobs that
would overwrite those slots until then (see :mod:`miniflex.worker.slot_guard`).
The copies run on threads of their own so that the job's thread goes on with
the next store, and on several (``copy_threads``; ``remote_copy_threads``), each
taking the next handed-over group, because a copy into fresh memory waits on a
page fault per 4 KiB page, and faults on several threads overlap: a burst of
stores longer than the CPU tier reuses each slot only once its copy is made.
Each group takes its buffers when a thread starts it, in the order the groups
were handed over, so that when ``max_bytes`` runs out the chunks dropped are the
later ones. The put thread asks the store which queued chunks it already
holds (another replica may have put them: one ``exists`` round trip per batch)
and puts the rest, each once no fetch of the same rank is in flight
(:mod:`miniflex.remote.fetch_gate`: loads before puts).

Buffers are kept for reuse once their put is done: a copy into fresh memory
pays a page fault per 4 KiB page, which makes it many times slower than a
copy into a reused buffer. Queued and spare buffers together stay within
``max_bytes``; a chunk offered past that (the store is slower than the
engine's stores, or down and failing fast) is dropped and counted in
``dropped``: the local tiers still hold it. Nothing waits for the store: no
job's result, no request, no vLLM step. Example::

    up = RemoteUploader(store, max_bytes=1 << 30)   # remote_write_backlog
    up.offer_later([(key, pool.slot(7))], copied)   # returns; copied() once copied
    up.offer(key, pool.slot(7))     # or copy on this thread: copies, queues, returns
    up.close()                      # puts what is queued, then stops
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from miniflex.bytecopy import copy_into
from miniflex.plan import PutOutcome
from miniflex.remote.base import RemoteStore
from miniflex.remote.fetch_gate import FetchGate
from miniflex.types import ChunkKey

__all__ = ["UPLOAD_QUEUE_BYTES", "RemoteUploader", "UploadStats"]

logger = logging.getLogger("miniflex.remote")

UPLOAD_QUEUE_BYTES = 1 << 30
"""Bytes of chunks waiting for their put, at most, before new ones are dropped."""
COPY_THREADS = 4
"""Copy threads of an uploader unless told otherwise (``remote_copy_threads``)."""
_BATCH = 16


@dataclass(frozen=True)
class UploadStats:
    """Counters of one uploader (a snapshot)."""

    offered: int = 0
    put: int = 0
    """Chunks the store acknowledged."""
    skipped: int = 0
    """Chunks the store held already (put by another replica, or earlier)."""
    failed: int = 0
    dropped: int = 0
    """Chunks dropped unqueued: ``max_bytes`` were waiting already."""
    buffer_bytes: int = 0
    """Host memory of the copy buffers: queued, being put, and kept for reuse."""


class _Buffers:
    """Copy buffers of the uploader: allocated up to ``max_bytes`` in all, reused once put.

    Not thread safe: the uploader calls it under its lock.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        """Bytes of every buffer: queued, being put, and spare."""
        self._spare: dict[int, list[np.ndarray]] = {}  # by size; never an empty list

    def take(self, nbytes: int) -> np.ndarray | None:
        """A buffer of ``nbytes`` (None: ``max_bytes`` are held by queued chunks already)."""
        if spare := self._spare.get(nbytes):
            buf = spare.pop()
            if not spare:
                del self._spare[nbytes]
            return buf
        while self.held + nbytes > self.max_bytes and self._spare:  # spares of other sizes
            size, bufs = next(iter(self._spare.items()))
            self.held -= bufs.pop().nbytes
            if not bufs:
                del self._spare[size]
        if self.held + nbytes > self.max_bytes:
            return None
        buf = np.empty(nbytes, dtype=np.uint8)  # may raise: nothing is counted then
        self.held += nbytes
        return buf

    def give_back(self, buf: np.ndarray) -> None:
        self._spare.setdefault(buf.nbytes, []).append(buf)


Copies = list[tuple[ChunkKey, memoryview | np.ndarray]]
"""Chunks to copy for their puts: ``(key, the slot's bytes)``."""


class RemoteUploader:
    """Puts chunks to one shard's store on threads of its own; see the module docstring."""

    def __init__(
        self,
        store: RemoteStore,
        max_bytes: int = UPLOAD_QUEUE_BYTES,
        gate: FetchGate | None = None,
        copy_threads: int = COPY_THREADS,
    ) -> None:
        """``gate``: the rank's fetches, which each put waits for (None: puts never wait);
        ``copy_threads``: groups handed over that are copied at once."""
        assert copy_threads >= 1, "an uploader needs a copy thread"
        self.store = store
        self._gate = gate
        self._buffers = _Buffers(max_bytes)
        self._queue: deque[tuple[ChunkKey, np.ndarray]] = deque()
        self._copies: deque[tuple[Copies, Callable[[], None]]] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._putting = False
        self._copying = 0  # copy threads busy with a group
        self._counts = {name: 0 for name in UploadStats.__dataclass_fields__}
        del self._counts["buffer_bytes"]
        self._reported = dict(self._counts)  # the counts as of the last take_outcome()
        self._threads = [threading.Thread(target=self._run, name="miniflex-remote-put")]
        self._threads += [
            threading.Thread(target=self._run_copies, name=f"miniflex-remote-copy-{i}")
            for i in range(copy_threads)
        ]
        for thread in self._threads:
            thread.daemon = True
            thread.start()

    def offer_later(self, chunks: Copies, copied: Callable[[], None]) -> None:
        """Copy ``chunks`` for their puts on a copy thread, then call ``copied`` (once, from
        that thread, or from this one if the uploader is closed): until then the caller
        keeps their bytes unchanged. Returns at once."""
        with self._cond:
            if not self._closed:
                self._copies.append((chunks, copied))
                self._cond.notify_all()
                return
            self._counts["offered"] += len(chunks)
            self._counts["dropped"] += len(chunks)
        copied()

    def not_put(self, chunks: int) -> None:
        """``chunks`` meant for puts never reached the uploader (their job failed)."""
        self._count(offered=chunks, failed=chunks)

    def offer(self, key: ChunkKey, data: np.ndarray | memoryview) -> bool:
        """Queue a copy of ``data`` for a put under ``key``, copied on this thread; False:
        dropped (``max_bytes`` queued already, or the uploader is closed)."""
        with self._cond:
            if self._closed:
                self._counts["offered"] += 1
                self._counts["dropped"] += 1
                return False
            buf = self._take(data)
        return buf is not None and self._copy(key, data, buf)

    def _take(self, data: np.ndarray | memoryview) -> np.ndarray | None:
        """A buffer for ``data``'s copy, counted as offered (None: dropped, counted); called
        under the lock."""
        self._counts["offered"] += 1
        buf = self._buffers.take(memoryview(data).nbytes)
        if buf is None:
            self._counts["dropped"] += 1
            if self._counts["dropped"] == 1:
                logger.warning(
                    "MiniFlex remote store %s: write-through is behind by "
                    "remote_write_backlog (%d bytes): chunks are not put until it catches "
                    "up (the local tiers keep them)",
                    self.store.url,
                    self._buffers.max_bytes,
                )
        return buf

    def _take_safely(self, data: np.ndarray | memoryview) -> np.ndarray | None:
        """:meth:`_take`, never raising (a copy thread must live on): a chunk whose buffer
        cannot be had (no memory, a released view) is counted failed; under the lock."""
        try:
            return self._take(data)
        except Exception as exc:
            logger.error("MiniFlex: no buffer for a remote put's copy: %s", exc)
            self._counts["failed"] += 1
            return None

    def _copy(self, key: ChunkKey, data: np.ndarray | memoryview, buf: np.ndarray) -> bool:
        """Copy ``data`` into ``buf`` (outside the lock) and queue its put; False: failed."""
        try:
            copy_into(buf, 0, data)  # outside the lock, and the interpreter's (bytecopy.py)
        except Exception as exc:  # the buffer goes back; the chunk is not put
            logger.error("MiniFlex: a remote put's copy failed: %s", exc)
            with self._cond:
                self._buffers.give_back(buf)
                self._counts["failed"] += 1
            return False
        with self._cond:
            self._queue.append((key, buf))
            self._cond.notify_all()
        return True

    def stats(self) -> UploadStats:
        with self._cond:
            return UploadStats(**self._counts, buffer_bytes=self._buffers.held)

    def take_outcome(self) -> PutOutcome:
        """What the puts came to since the last call (the worker's report to the scheduler);
        ``wait_seconds`` is the gate's, where the uploader has one."""
        waited = self._gate.take_waited() if self._gate is not None else 0.0
        with self._cond:
            c, last = self._counts, self._reported
            out = PutOutcome(
                c["put"] - last["put"],
                c["skipped"] - last["skipped"],
                c["failed"] - last["failed"],
                c["dropped"] - last["dropped"],
                waited,
            )
            self._reported = dict(c)
        return out

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every chunk handed over was copied and put (or failed); False if
        ``timeout_s`` ran out."""
        with self._cond:
            return self._cond.wait_for(
                lambda: not (self._queue or self._copies or self._putting or self._copying),
                timeout_s,
            )

    def close(self) -> None:
        """Copy and put what was handed over (each put bounded by the store's timeout), then
        stop; idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=60)

    def _run_copies(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._copies or self._closed)
                if not self._copies:
                    self._cond.notify_all()  # the put thread may stop now
                    return
                chunks, copied = self._copies.popleft()
                bufs = [self._take_safely(data) for _, data in chunks]  # in the order handed over
                self._copying += 1
            for (key, data), buf in zip(chunks, bufs, strict=True):
                if buf is not None:
                    self._copy(key, data, buf)  # never raises: a failed copy is counted
            _call_safely(copied)
            with self._cond:
                self._copying -= 1
                self._cond.notify_all()

    def _run(self) -> None:
        def ready() -> bool:
            return bool(self._queue) or (self._closed and not self._copies and not self._copying)

        while True:
            with self._cond:
                self._cond.wait_for(ready)
                if not self._queue:
                    return
                batch = [self._queue.popleft() for _ in range(min(_BATCH, len(self._queue)))]
                self._putting = True
            try:
                self._put(batch)
            except Exception as exc:  # never kill the thread: count the batch as failed
                logger.error("MiniFlex remote put failed: %s", exc)
                self._count(failed=len(batch))
            with self._cond:
                for _, buf in batch:
                    self._buffers.give_back(buf)
                self._putting = False
                self._cond.notify_all()

    def _put(self, batch: list[tuple[ChunkKey, np.ndarray]]) -> None:
        held = self.store.exists([key for key, _ in batch])
        put = failed = 0
        for (key, data), there in zip(batch, held, strict=True):
            if there:
                continue
            if self._gate is not None:
                self._gate.wait_idle(lambda: self._closed)  # loads first
            try:
                ok = self.store.put(key, memoryview(data))
            except Exception as exc:  # one chunk lost, the rest of the batch still goes
                logger.error("MiniFlex remote put failed: %s", exc)
                ok = False
            put, failed = put + ok, failed + (not ok)
        self._count(put=put, failed=failed, skipped=sum(held))

    def _count(self, **deltas: int) -> None:
        with self._cond:
            for name, n in deltas.items():
                self._counts[name] += n


def _call_safely(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:  # a caller's callback must not stop the copy thread
        logger.error("MiniFlex: a remote put's copied callback failed: %s", exc)
