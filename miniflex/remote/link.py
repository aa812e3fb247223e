"""The health of the link to a remote store: counters, the fast-fail window, logs.

Every backend call goes through one :class:`Link`. After a connection failure
or a timeout the link is *down*: for ``retry_s`` every call is refused at once
(``fast_fails``), so a dead or hung store costs one timeout, not one per call.
When the window ends, the next call (one caller only; the window is pushed
forward for the others) tries the store again; its success marks the link up
(``reconnects``). Transitions are logged once each, not per call::

    link = Link("redis://cache:6379", retry_s=1.0)
    if link.allow():
        try: ...; link.succeeded()
        except ConnectionError as exc: link.failed(exc, timeout=False)
    else: ...  # refused without contacting the store
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from miniflex.remote.base import RemoteStats

__all__ = ["Link"]

log = logging.getLogger("miniflex.remote")

_REPLY_LOG_INTERVAL_S = 60.0


class Link:
    """Up/down state and counters of one store; thread safe."""

    def __init__(
        self, url: str, retry_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.url = url
        self._retry_s = retry_s
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {f.name: 0 for f in dataclasses.fields(RemoteStats)}
        del self._counts["down"]
        self._down_since: float | None = None
        self._retry_at = 0.0
        self._next_reply_log = 0.0

    def count(self, **deltas: int) -> None:
        """Add to counters named like :class:`RemoteStats` fields."""
        with self._lock:
            for name, n in deltas.items():
                self._counts[name] += n

    def stats(self) -> RemoteStats:
        with self._lock:
            return RemoteStats(**self._counts, down=self._down_since is not None)

    def allow(self) -> bool:
        """Whether a call may contact the store now; a refusal is counted in ``fast_fails``."""
        with self._lock:
            if self._down_since is None:
                return True
            now = self._clock()
            if now >= self._retry_at:
                self._retry_at = now + self._retry_s  # this caller probes; others keep failing fast
                return True
            self._counts["fast_fails"] += 1
            return False

    def succeeded(self) -> None:
        """The store answered: mark the link up (logged if it was down)."""
        with self._lock:
            if self._down_since is None:
                return
            down_s = self._clock() - self._down_since
            self._down_since = None
            self._counts["reconnects"] += 1
        log.warning("remote store %s: reachable again after %.1f s", self.url, down_s)

    def failed(self, exc: BaseException, timeout: bool) -> None:
        """A connection failure or timeout: count it and mark the link down for ``retry_s``."""
        with self._lock:
            self._counts["errors"] += 1
            self._counts["timeouts"] += int(timeout)
            now = self._clock()
            self._retry_at = now + self._retry_s
            if self._down_since is not None:
                return
            self._down_since = now
        log.warning(
            "remote store %s: unreachable (%s); calls fail at once for %.1f s between retries, "
            "serving from the local tiers meanwhile",
            self.url,
            exc,
            self._retry_s,
        )

    def refused(self, exc: BaseException, what: str) -> None:
        """The store answered ``what`` with an error reply: count it, log at most once a minute."""
        with self._lock:
            self._counts["errors"] += 1
            now = self._clock()
            if now < self._next_reply_log:
                return
            self._next_reply_log = now + _REPLY_LOG_INTERVAL_S
        log.warning("remote store %s: %s failed: %s", self.url, what, exc)
