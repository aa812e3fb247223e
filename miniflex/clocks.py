"""The time MiniFlex takes from vLLM: wall time inside its hooks, CPU time of its threads.

vLLM calls the connector's hooks on its own threads (the scheduler's, each
worker's), so their wall time adds to every engine step, waits for in-step
loads included. MiniFlex's transfer and SSD threads run beside vLLM's and take
CPU, and the interpreter, from it; a thread that waits the right way (blocked,
not spinning) takes none while it waits. Both are reported as counters
(``scheduler_hook_seconds``, ``worker_hook_seconds``, ``thread_cpu_seconds``),
so an operator can tell what the connector costs a live engine.

:data:`HOOKS` also tallies the time per hook in this process (calls, total,
longest call), which the connector logs when it shuts down: where the time
went, a wait or plain work.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

__all__ = ["HOOKS", "HookTally", "HookTimed", "ThreadClock", "timed_hook"]

P = ParamSpec("P")
R = TypeVar("R")


class HookTimed(Protocol):
    hook_seconds: float
    """Wall seconds spent in the object's timed hooks; the owner reads and resets it."""


S = TypeVar("S", bound=HookTimed)


class HookTally:
    """Calls, total and longest wall time per hook name, in this process."""

    def __init__(self) -> None:
        self._by_name: dict[str, list[float]] = {}  # name -> [calls, seconds, longest]

    def add(self, name: str, seconds: float) -> None:
        t = self._by_name.get(name)
        if t is None:
            self._by_name[name] = [1, seconds, seconds]
            return
        t[0] += 1
        t[1] += seconds
        if seconds > t[2]:
            t[2] = seconds

    def log_summary(self) -> None:
        """Log :meth:`summary` (an engine's halves do as they shut down), if any hook ran."""
        summary = self.summary()
        if summary:
            logging.getLogger("miniflex.connector").info(
                "MiniFlex hooks (calls/total/longest): %s", summary
            )

    def summary(self, top: int = 8) -> str:
        """The ``top`` hooks by total time: ``name calls/total ms/longest ms``; "" if none."""
        rows = sorted(self._by_name.items(), key=lambda kv: -kv[1][1])[:top]
        return ", ".join(
            f"{name} {int(n)}/{1e3 * total:.0f} ms/{1e3 * longest:.1f} ms"
            for name, (n, total, longest) in rows
        )


HOOKS = HookTally()
"""Every timed hook of this process (scheduler and worker halves alike)."""


def timed_hook(fn: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """Add the wall time of each call of method ``fn`` to its object's ``hook_seconds``
    (and to :data:`HOOKS`)."""
    name = fn.__name__

    @functools.wraps(fn)
    def timed(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        t0 = time.perf_counter()
        try:
            return fn(self, *args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            self.hook_seconds += dt
            HOOKS.add(name, dt)

    return timed


class ThreadClock:
    """CPU seconds that MiniFlex's threads report; :meth:`take` returns those since the last."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self._seconds += seconds

    def take(self) -> float:
        with self._lock:
            out, self._seconds = self._seconds, 0.0
        return out
