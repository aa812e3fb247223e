"""The worker's handlers, one per medium pair, each with its own queue and thread.

A rank's jobs move bytes between four media: vLLM's GPU blocks, the CPU pool's
slots, the SSD store and the remote store. Each direction that the worker runs
is a :class:`Lane`, so a slow medium holds up only its own jobs:

=============  =====================  ==============================================
lane           moves                  runs
=============  =====================  ==============================================
gpu-load       CPU slots -> GPU       a LOAD's copies, once its reads are done
gpu-store      GPU -> CPU slots       the STORE jobs of one plan as one copy
ssd-write      CPU slots -> SSD       DEMOTE (write-back), CLEAR
ssd-read       SSD -> CPU slots       a LOAD's promotions, then its streamed windows
remote-fetch   remote -> CPU slots    a LOAD's remote fetches (and its streamed windows,
                                      if it reads nothing from SSD)
=============  =====================  ==============================================

Remote puts (CPU slots -> remote) have a handler of their own, the store's
uploader (:mod:`miniflex.remote.uploader`), with its own copy and put threads.

A LOAD that needs reads is chained from lane to lane by the handler
(:class:`~miniflex.worker.handler.MiniFlexHandler`): remote-fetch, then ssd-read,
then gpu-load, skipping a lane it has nothing for. So a remote fetch that stalls
holds up neither another request's SSD reads nor any GPU copy.

Every lane runs its items one at a time, in the order they were submitted. Its
``run`` reports each item's outcome itself (the job's future); one that raises
anyway is a bug, which the lane logs and hands to ``fail``, so that the item's
future is still resolved and nothing waits for it forever. Example::

    lane = Lane("gpu-load", run=lambda item: ..., fail=lambda item, exc: ...)
    lane.start()
    lane.submit(item)
    lane.wait()  # every item submitted so far has run
    lane.close()
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from miniflex.clocks import ThreadClock

__all__ = ["Lane"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_CLOSE = object()


class Lane(Generic[T]):
    """One medium pair's queue and thread; verbs ``submit``, ``wait``, ``close``."""

    def __init__(
        self, name: str, run: Callable[[T], None], fail: Callable[[T, Exception], None]
    ) -> None:
        """``run``: runs one item and reports it (must not raise); ``fail``: reports an item
        whose ``run`` raised all the same."""
        self.name = name
        self._run, self._fail = run, fail
        self._queue: queue.Queue[object] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._cpu = ThreadClock()

    def start(self) -> None:
        """Start the lane's thread (``miniflex-<name>``, a daemon); idempotent."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name=f"miniflex-{self.name}", daemon=True
            )
            self._thread.start()

    def submit(self, item: T) -> None:
        """Queue ``item``; it runs after every item submitted before it. Any thread."""
        self._queue.put(item)

    def wait(self) -> None:
        """Block until every item submitted so far (and any submitted meanwhile) has run."""
        self._queue.join()

    def take_cpu(self) -> float:
        """CPU seconds the lane's thread spent running items since the last call."""
        return self._cpu.take()

    def close(self, timeout_s: float = 30.0) -> None:
        """Run what is queued, then stop the thread (waits up to ``timeout_s``)."""
        if self._thread is not None:
            self._queue.put(_CLOSE)
            self._thread.join(timeout=timeout_s)
            self._thread = None

    def _loop(self) -> None:
        while (item := self._queue.get()) is not _CLOSE:
            cpu = time.thread_time()
            try:
                self._run(item)  # type: ignore[arg-type]
            except Exception as exc:  # a bug in run: report the item, keep the lane alive
                logger.exception("MiniFlex %s lane: an item raised", self.name)
                self._fail_safely(item, exc)  # type: ignore[arg-type]
            finally:
                self._cpu.add(time.thread_time() - cpu)
                self._queue.task_done()
        self._queue.task_done()

    def _fail_safely(self, item: T, exc: Exception) -> None:
        try:
            self._fail(item, exc)
        except Exception:
            logger.exception("MiniFlex %s lane: reporting a failed item raised", self.name)
