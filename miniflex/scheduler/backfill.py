"""Backfill: requests that fit in vLLM's KV cache go ahead of one that does not.

vLLM admits waiting requests first come, first served, and stops at the first
one whose prompt does not fit in the free GPU blocks: every request behind it
waits too, even one that shares a prefix already on the GPU and needs a handful
of blocks. Under a burst over shared prefixes that keeps the batch small (one
request per prefix running) while the GPU could run the whole group of each.

vLLM lets a connector pass over a waiting request for a step: its lookup
answers "not known yet" (``get_num_new_matched_tokens`` returns None) and vLLM
goes on to the next one. :class:`Backfill` uses that, and only for a request
that vLLM looked up and then did not admit (a step's lookups that got no
``update_state_after_alloc`` before ``build_connector_meta``): it did not fit.
Such a request is passed over until room appears (a request finished or had
its blocks freed), when the oldest one passed over is tried again, or until it
needs fewer blocks than when it failed (its prefix reached the GPU meanwhile);
and never once it has waited ``wait_s`` since it first failed: from then on it
holds the queue, as vLLM would. A request that needs at least as many blocks as
one that failed since the last room is passed over without being tried. At most
``MAX_PASSES_PER_STEP`` requests are passed over in a step. A request that fits
is never held back.

Scheduler side, one thread. Example::

    backfill = Backfill(wait_s=5.0)
    if backfill.passes_over("r7", need=260): return None, False  # in the lookup
    backfill.asked("r7", need=260)      # the lookup answered vLLM
    backfill.admitted("r3")             # update_state_after_alloc
    backfill.end_step()                 # build_connector_meta: r7 did not fit
    backfill.room()                     # a request's blocks were freed: r7 tries again
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from miniflex.types import ReqId

__all__ = ["MAX_PASSES_PER_STEP", "Backfill"]

MAX_PASSES_PER_STEP = 128
"""Most requests passed over in one step. vLLM computes each waiting request's GPU hit
before it asks the connector, so a step that passes over the whole of a long queue
costs vLLM that much work; past this many, the next request is tried, as vLLM would."""


@dataclass
class _Waiting:
    since: float  # when it first did not fit
    need: int  # GPU blocks it asked for
    retry: bool = False  # room appeared: vLLM may try it once more


class Backfill:
    """Which waiting requests the lookup passes over for a step (module docstring)."""

    def __init__(self, wait_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        """``wait_s``: the longest a request is passed over (0: never; vLLM's order)."""
        if wait_s < 0:
            raise ValueError(f"wait_s must be >= 0, got {wait_s}")
        self.wait_s = wait_s
        self._clock = clock
        self._waiting: dict[ReqId, _Waiting] = {}  # in the order they first did not fit
        self._asked: dict[ReqId, int] = {}  # answered this step -> blocks it needs
        self._unfit: int | None = None  # fewest blocks a request failed to get since room
        self._passes = 0  # passed over this step

    @property
    def enabled(self) -> bool:
        return self.wait_s > 0

    def passes_over(self, req_id: ReqId, need: int) -> bool:
        """True: answer this lookup "not known yet", so vLLM tries the requests behind.

        ``need``: the GPU blocks the request would take (its prompt's, less vLLM's hit).
        A request that needs as many blocks as one that did not fit since the last room
        would not fit either: it is passed over without being tried (a queue's worth of
        them in one step, not one a step)."""
        if not self.enabled or self._passes >= MAX_PASSES_PER_STEP:
            return False
        now = self._clock()
        fits = self._unfit is None or need < self._unfit
        w = self._waiting.get(req_id)
        if w is None:
            if fits:
                return False
            w = self._waiting[req_id] = _Waiting(now, need)
        elif w.retry or (fits and need < w.need):  # room, or its prefix reached the GPU
            w.retry = False
            return False
        passed = now - w.since < self.wait_s
        self._passes += passed
        return passed

    def asked(self, req_id: ReqId, need: int) -> None:
        """The lookup gave vLLM an answer: unless it is admitted, it did not fit."""
        if self.enabled:
            self._asked[req_id] = need

    def admitted(self, req_id: ReqId) -> None:
        """vLLM allocated the request's blocks."""
        self._asked.pop(req_id, None)
        self._waiting.pop(req_id, None)

    def end_step(self) -> None:
        """The step is scheduled: the requests answered and not admitted did not fit."""
        now = self._clock()
        self._passes = 0
        for r, need in self._asked.items():
            w = self._waiting.get(r)
            if w is None:
                self._waiting[r] = _Waiting(now, need)
            else:
                w.need = need
            self._unfit = need if self._unfit is None else min(self._unfit, need)
        self._asked.clear()

    def room(self, times: int = 1) -> None:
        """Blocks were freed: the ``times`` oldest requests passed over may try again,
        and a request is no longer judged by what did not fit before."""
        self._unfit = None
        now = self._clock()
        for w in self._waiting.values():
            if times <= 0:
                return
            if not w.retry and now - w.since < self.wait_s:
                w.retry = True
                times -= 1

    def forget(self, req_id: ReqId) -> None:
        """The request ended (finished or aborted while it waited)."""
        self._waiting.pop(req_id, None)
        self._asked.pop(req_id, None)

    @property
    def num_waiting(self) -> int:
        """Requests that did not fit and are still waiting."""
        return len(self._waiting)
