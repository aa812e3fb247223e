"""Loads before puts: one rank's write-through puts wait while a load fetches.

A fetch is on a request's critical path (its TTFT waits for it); a put is not (the
local tiers hold the chunk meanwhile). Both share the store's servers, the host's
network stack and the interpreter, so puts sent beside a fetch slow it
(docs/benchmarks.md, "remote" and "Components", has the figures). The fetcher holds
the gate open for each fetch; the uploader's put thread waits, before each put, until
no fetch is in flight::

    gate = FetchGate()
    with gate.fetching():           # RemoteFetcher.fetch
        ...
    gate.wait_idle(lambda: closed)  # RemoteUploader, before a put

Puts then go out between loads. A rank that loads without pause holds its puts back
until its buffer of put copies (``remote_write_backlog``) fills and new puts are
dropped and counted: the local tiers still hold those chunks. Only write-through waits
(:class:`~miniflex.remote.tier.WorkerRemote`): write-back puts chunks the CPU tier has
evicted, which a dropped put would lose.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["FetchGate"]

POLL_S = 0.05
"""How often a waiting put looks again at whether it should stop waiting (``stop``)."""


class FetchGate:
    """Counts the fetches in flight on one rank; puts wait while there are any."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._fetching = 0
        self._waited_s = 0.0  # seconds puts waited for fetches since the last take_waited()

    @contextmanager
    def fetching(self) -> Iterator[None]:
        """Hold puts back for the duration of one fetch (fetches may overlap)."""
        with self._cond:
            self._fetching += 1
        try:
            yield
        finally:
            with self._cond:
                self._fetching -= 1
                self._cond.notify_all()

    def wait_idle(self, stop: Callable[[], bool]) -> float:
        """Return once no fetch is in flight, or ``stop()`` (e.g. the uploader closes: its
        queued puts go out); the seconds waited."""
        t0 = time.perf_counter()
        with self._cond:
            while self._fetching and not stop():
                self._cond.wait(POLL_S)
            waited = time.perf_counter() - t0
            self._waited_s += waited
        return waited

    def take_waited(self) -> float:
        """Seconds puts waited since the last call."""
        with self._cond:
            out, self._waited_s = self._waited_s, 0.0
        return out
