"""What a rank's jobs came to, kept until vLLM and the scheduler half ask for it.

Every job the worker queues gets a future here (:meth:`Completions.track`), resolved
on the lane that runs it. vLLM's thread then asks, once a step:

* :meth:`poll`: the requests whose loads finished (finished-receiving), and the
  released requests whose jobs are all done (finished-sending: vLLM may hand their
  blocks out again);
* :meth:`take_results`: every job's :class:`~miniflex.plan.JobResult`, for the
  scheduler half's accounting and cost model;
* :meth:`take_load_errors`: the blocks of loads that failed, which vLLM recomputes.

A request is finished-sending only once it is released *and* none of its jobs is
running, so a block is never handed out while a store still reads it. Example::

    done = Completions()
    fut = done.track("req-1")          # queued on a lane, resolved there
    done.release_when_done(["req-1"])
    fut.set_result(result)
    sending, recving = done.poll()     # {"req-1"}, {"req-1"} if it was a load
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future

from miniflex.plan import JobKind, JobResult
from miniflex.types import BlockId, ReqId

__all__ = ["Completions"]


class Completions:
    """The futures of one rank's queued jobs, by request; used from vLLM's thread."""

    def __init__(self) -> None:
        self._pending: dict[ReqId, list[Future[JobResult]]] = {}
        self._release: set[ReqId] = set()
        self._results: list[JobResult] = []
        self._load_errors: set[BlockId] = set()
        self._failed_loads: set[ReqId] = set()  # requests of the load errors

    def track(self, req_id: ReqId) -> Future[JobResult]:
        """A new job of ``req_id``: the future its lane resolves with its result."""
        fut: Future[JobResult] = Future()
        self._pending.setdefault(req_id, []).append(fut)
        return fut

    def add(self, res: JobResult) -> None:
        """A result reported directly (an in-step load's, waited for on vLLM's thread)."""
        self._results.append(res)
        self._note_errors(res)

    def in_flight(self, req_id: ReqId) -> int:
        """Jobs of this request queued or running (not yet done)."""
        return sum(not f.done() for f in self._pending.get(req_id, ()))

    def wait_for(self, req_ids: Iterable[ReqId]) -> None:
        """Block until every job of these requests tracked so far is done."""
        for r in req_ids:
            for fut in list(self._pending.get(r, ())):
                fut.result()

    def drain(self) -> None:
        """Block until every job tracked so far is done (shutdown, tests)."""
        self.wait_for(list(self._pending))

    def release_when_done(self, req_ids: Iterable[ReqId]) -> None:
        """Report these requests as finished-sending once none of their jobs is running."""
        self._release.update(req_ids)

    def poll(self) -> tuple[set[str], set[str]]:
        """``(finished_sending, finished_recving)`` since the last call; collects the results
        of the jobs done meanwhile."""
        recving: set[str] = set()
        for req_id, futs in list(self._pending.items()):
            still = []
            for fut in futs:  # one look per future: a lane may resolve it meanwhile
                if not fut.done():
                    still.append(fut)
                    continue
                res = fut.result()
                self._results.append(res)
                if res.kind is JobKind.LOAD:
                    recving.add(res.req_id)
                    self._note_errors(res)
            if still:
                self._pending[req_id] = still
            else:
                del self._pending[req_id]
        sending = {r for r in self._release if r not in self._pending}
        self._release -= sending
        return sending, recving

    def take_results(self) -> list[JobResult]:
        """Every result collected since the last call, in the order collected."""
        out, self._results = self._results, []
        return out

    def take_load_errors(self) -> tuple[set[BlockId], set[ReqId]]:
        """The blocks of the loads that failed since the last call, and their requests."""
        out = self._load_errors, self._failed_loads
        self._load_errors, self._failed_loads = set(), set()
        return out

    def _note_errors(self, res: JobResult) -> None:
        if res.failed_block_ids:
            self._load_errors.update(res.failed_block_ids)
            if res.req_id is not None:
                self._failed_loads.add(res.req_id)
