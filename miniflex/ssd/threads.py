"""The portable fallback: ``os.preadv``/``os.pwritev`` on a thread pool.

Both calls release the GIL, so ``queue_depth`` worker threads keep that many
ops in flight. A per-batch gate (:class:`_Batch`) lets ``run`` stop a batch on
the first failure or an interrupt and wait until no worker is inside a
transfer any more, which is what makes it safe to free the buffers when
``run`` returns or raises.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from miniflex.errors import IOBackendError
from miniflex.ssd.base import IOBackend, IOOp, check_ops, short_transfer_error

__all__ = ["ThreadBackend", "transfer"]


def transfer(op: IOOp) -> None:
    """Move all of ``op`` with positional I/O, resuming short transfers; raise IOBackendError."""
    call = os.pwritev if op.write else os.preadv
    done = 0
    while done < op.length:
        try:
            n = call(op.fd, [op.buf[done:]], op.offset + done)
        except OSError as exc:
            raise IOBackendError(
                exc.errno or errno.EIO, op.path, op.offset, op.length, op.op
            ) from exc
        if n == 0:
            raise short_transfer_error(op, done)
        done += n


class _Batch:
    """Which transfers of one ``run`` may still start, and how many are running.

    After op ``k`` fails, only ops with a higher index are skipped: every op
    before the lowest failure still runs, as with io_uring's in-order starts,
    so the error ``run`` raises does not depend on thread timing.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._skip_after: int | None = None
        self._active = 0

    def task(self, index: int, op: IOOp) -> None:
        """Run ``op`` unless an earlier op failed or the batch was halted."""
        with self._cond:
            if self._skip_after is not None and index > self._skip_after:
                return
            self._active += 1
        try:
            transfer(op)
        except BaseException:
            with self._cond:
                if self._skip_after is None or index < self._skip_after:
                    self._skip_after = index
            raise
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def halt(self) -> None:
        """Start nothing more; return once no transfer is running."""
        with self._cond:
            self._skip_after = -1
            self._cond.wait_for(lambda: self._active == 0)


class ThreadBackend(IOBackend):
    """Blocking positional I/O on ``queue_depth`` threads; works wherever Python does."""

    def __init__(self, queue_depth: int = 64) -> None:
        if queue_depth < 1:
            raise ValueError(f"threads queue_depth must be >= 1, got {queue_depth}")
        self._depth = queue_depth
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(
            max_workers=queue_depth, thread_name_prefix="miniflex-ssd"
        )
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return "threads"

    @property
    def queue_depth(self) -> int:
        return self._depth

    @property
    def closed(self) -> bool:
        return self._pool is None

    def run(self, ops: Sequence[IOOp]) -> None:
        ops = list(ops)
        check_ops(ops)
        with self._lock:
            if self._pool is None:
                raise self._closed_error()
            batch = _Batch()
            futures: list[Future[None]] = []
            try:
                futures.extend(self._pool.submit(batch.task, i, op) for i, op in enumerate(ops))
                wait(futures)
            finally:
                batch.halt()
        for future in futures:  # in op order: the lowest failed index wins
            exc = future.exception()
            if exc is not None:
                raise exc

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
