"""When the scheduler's state is snapshotted, and what ``/metrics`` shows of it.

The snapshot (``MiniFlexManager.status()``: tiers, cost model, totals) is taken
on the scheduler's thread, from the hooks vLLM calls after each engine step:
at most once per ``interval`` while requests or transfers are in flight, and
once each time the engine falls idle, after the step that ended the last
transfer. So the idle state (nothing pinned, no job in flight) is always the
last one published, to the status file (:class:`StatusWriter`, which rewrites
it on a timer) and to ``/metrics`` (gauges riding on the connector stats; when
a request ends between engine steps, the connector keeps the engine stepping
once more so that they are sent).

Gauges are keys of the stats dict that start with :data:`GAUGE_PREFIX`; they
are levels, not counters: aggregating keeps the latest value.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from miniflex.connector.status import StatusWriter

__all__ = ["GAUGE_PREFIX", "LiveState", "gauges_of"]

GAUGE_PREFIX = "now_"
TIER_LEVELS = ("resident", "pinned_or_moving", "free")


def gauges_of(state: dict[str, Any]) -> dict[str, int]:
    """The levels of a snapshot as stats keys: ``now_cpu_resident``, ``now_jobs_in_flight``,
    ``now_ssd_write_backlog``..."""
    out = {
        f"{GAUGE_PREFIX}{t['tier']}_{level}": int(t[level])
        for t in state["tiers"]
        for level in TIER_LEVELS
    }
    out[GAUGE_PREFIX + "jobs_in_flight"] = int(state["jobs_in_flight"])
    out[GAUGE_PREFIX + "requests_tracked"] = int(state["requests_tracked"])
    out[GAUGE_PREFIX + "ssd_write_backlog"] = int(state["ssd_write_backlog"])
    return out


class LiveState:
    """Decides when to snapshot; hands each snapshot to the status file, and its gauges back.

    Called from the scheduler's thread only.
    """

    def __init__(self, status_path: str | None, interval: float = 1.0) -> None:
        self.interval = interval
        self._status = None if status_path is None else StatusWriter(status_path, interval)
        self._taken_at = float("-inf")
        self._idle = False

    def start(self, state: dict[str, Any]) -> None:
        """The first snapshot; starts the status file's timer."""
        if self._status is not None:
            self._status.update(state)
            self._status.start()
        self._taken_at = time.monotonic()

    def observe(self, busy: bool, snapshot: Callable[[], dict[str, Any]]) -> dict[str, int] | None:
        """After a step (or a request's end): the gauges of a new snapshot when one is due
        (``interval`` passed, or the engine just fell idle), else None."""
        now = time.monotonic()
        was_idle, self._idle = self._idle, not busy
        if now - self._taken_at < self.interval and (busy or was_idle):
            return None
        state = snapshot()
        self._taken_at = now
        if self._status is not None:
            self._status.update(state)
        return gauges_of(state)

    def close(self, final: dict[str, Any]) -> None:
        """At shutdown: the final state, written once more; the timer stops."""
        if self._status is not None:
            self._status.close(final)
