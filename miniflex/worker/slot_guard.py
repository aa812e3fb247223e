"""CPU slots that background work still reads, and the jobs that must wait to overwrite them.

A slot's bytes may still be read after the scheduler considers the slot free or
reusable: an SSD write-back (DEMOTE) reads it until its write is done, and a
remote put copies it after the STORE that filled it has been reported (so that
vLLM gets the store's GPU blocks back without waiting for the copy). Such work
is registered against the slot with :meth:`SlotGuard.hold`; a job that
overwrites the slot (a store into it, an SSD read or a remote fetch into it) is
queued through :meth:`SlotGuard.after`, once every reader is done. Jobs queued
after it never wait for those readers. Thread-safe; readers' futures may
complete on any thread. Example::

    guard = SlotGuard()
    guard.hold([SlotId(3)], demote_future)
    guard.after({SlotId(3)}, lambda: store_queue.put(item))  # when the demote is done
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future

from miniflex.plan import JobResult
from miniflex.types import SlotId

__all__ = ["SlotGuard"]


class SlotGuard:
    """Which CPU slots are being read by background work, and what waits for them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._readers: dict[SlotId, list[Future[JobResult]]] = {}

    def hold(self, slots: Iterable[SlotId], reader: Future[JobResult]) -> None:
        """``reader`` reads these slots until it is done; every reader of a slot is kept."""
        with self._lock:
            for s in slots:
                live = [f for f in self._readers.get(s, ()) if not f.done()]
                self._readers[s] = [*live, reader]

    def prune(self) -> None:
        """Forget the readers that are done (called once a step)."""
        with self._lock:
            self._readers = {
                s: live
                for s, fs in self._readers.items()
                if (live := [f for f in fs if not f.done()])
            }

    def wait_all(self) -> None:
        """Block until every reader registered so far is done."""
        with self._lock:
            readers = {f for fs in self._readers.values() for f in fs}
        for f in readers:
            f.result()

    def busy(self, slots: Iterable[SlotId]) -> bool:
        """Whether any of ``slots`` has a reader still running (a job that writes them would
        wait in :meth:`after`)."""
        with self._lock:
            return any(not f.done() for s in slots for f in self._readers.get(s, ()))

    def after(self, slots: set[SlotId], then: Callable[[], None]) -> None:
        """Call ``then()`` once every reader of ``slots`` is done: here if none is running,
        else on the thread that completes the last of them."""
        with self._lock:
            waits = {f for s in slots for f in self._readers.get(s, ()) if not f.done()}
        if not waits:
            then()
            return
        left = [len(waits)]
        lock = threading.Lock()

        def one_done(_: Future[JobResult]) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                then()

        for f in waits:
            f.add_done_callback(one_done)
