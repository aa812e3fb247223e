"""Write-through to the remote store, off every critical path: a bounded queue and a thread.

A STORE job's puts (:attr:`TransferJob.remote`) are offered here by the
store thread once the job's GPU->CPU copy is done and reported (vLLM gets the
job's blocks back without waiting for this). :meth:`RemoteUploader.offer`
copies the slot's bytes (the scheduler may reuse the slot once the store is
reported; the worker holds jobs that would overwrite it until the copy is
made, see :mod:`miniflex.worker.slot_guard`) and returns; a thread of its own
asks the store which of the queued chunks it already holds (another replica
may have put them: one ``exists`` round trip per batch) and puts the rest.

Nothing waits for it: no job's result, no request, no vLLM step. When the
queue holds ``max_bytes`` already (the store is slower than the engine's
stores, or down and failing fast), a chunk offered is dropped and counted in
``dropped``: the local tiers still hold it. Example::

    up = RemoteUploader(store, max_bytes=1 << 30)   # remote_write_backlog
    up.offer(key, pool.slot(7))     # copies, queues, returns
    up.close()                      # puts what is queued, then stops
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

from miniflex.bytecopy import owned_copy
from miniflex.remote.base import RemoteStore
from miniflex.types import ChunkKey

__all__ = ["UPLOAD_QUEUE_BYTES", "RemoteUploader", "UploadStats"]

logger = logging.getLogger("miniflex.remote")

UPLOAD_QUEUE_BYTES = 1 << 30
"""Bytes of chunks waiting for their put, at most, before new ones are dropped."""
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


class RemoteUploader:
    """Puts chunks to one shard's store on a thread of its own; see the module docstring."""

    def __init__(self, store: RemoteStore, max_bytes: int = UPLOAD_QUEUE_BYTES) -> None:
        self.store = store
        self._max_bytes = max_bytes
        self._queue: deque[tuple[ChunkKey, np.ndarray]] = deque()
        self._bytes = 0
        self._cond = threading.Condition()
        self._closed = False
        self._busy = False
        self._counts = {name: 0 for name in UploadStats.__dataclass_fields__}
        self._thread = threading.Thread(target=self._run, name="miniflex-remote-put", daemon=True)
        self._thread.start()

    def offer(self, key: ChunkKey, data: np.ndarray | memoryview) -> bool:
        """Queue a copy of ``data`` for a put under ``key``; False: dropped (queue full)."""
        nbytes = memoryview(data).nbytes
        with self._cond:
            self._counts["offered"] += 1
            if self._closed or self._bytes + nbytes > self._max_bytes:
                self._counts["dropped"] += 1
                first = self._counts["dropped"] == 1
                if first and not self._closed:
                    logger.warning(
                        "MiniFlex remote store %s: write-through is behind by "
                        "remote_write_backlog (%d bytes): chunks are not put until it catches "
                        "up (the local tiers keep them)",
                        self.store.url,
                        self._max_bytes,
                    )
                return False
        copy = owned_copy(data)  # outside the lock, and the interpreter's (bytecopy.py)
        with self._cond:
            self._queue.append((key, copy))
            self._bytes += nbytes
            self._cond.notify()
        return True

    def stats(self) -> UploadStats:
        with self._cond:
            return UploadStats(**self._counts)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued chunk was put or failed; False if ``timeout_s`` ran out."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout_s)

    def close(self) -> None:
        """Put what is queued (each put bounded by the store's timeout), then stop; idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                batch = [self._queue.popleft() for _ in range(min(_BATCH, len(self._queue)))]
                self._busy = True
            try:
                self._put(batch)
            except Exception as exc:  # never kill the thread: count the batch as failed
                logger.error("MiniFlex remote put failed: %s", exc)
                self._count(failed=len(batch))
            with self._cond:
                self._bytes -= sum(data.nbytes for _, data in batch)
                self._busy = False
                self._cond.notify_all()

    def _put(self, batch: list[tuple[ChunkKey, np.ndarray]]) -> None:
        held = self.store.exists([key for key, _ in batch])
        put = failed = 0
        for (key, data), there in zip(batch, held, strict=True):
            if there:
                continue
            if self.store.put(key, memoryview(data)):
                put += 1
            else:
                failed += 1
        self._count(put=put, failed=failed, skipped=sum(held))

    def _count(self, **deltas: int) -> None:
        with self._cond:
            for name, n in deltas.items():
                self._counts[name] += n
