"""One engine step on a worker, in the order vLLM calls the connector's hooks.

The facade (:class:`~miniflex.connector.connector.MiniFlexConnector`) forwards each worker
hook here in one line; this class owns what each hook does and why, in step order:

1. ``bound``: the step's plan arrives (``bind_connector_metadata``, before the forward):
   the forward's timer starts.
2. ``preempted`` (``handle_preemptions``): stores of requests vLLM preempted finish
   before their blocks can be handed out again.
3. ``before_forward`` (``start_load_kv``): the same wait, then the plan's demotions and
   loads are queued, and its in-step loads issued.
4. ``layer`` (``wait_for_layer_load``, before each attention layer): that layer is
   ordered after the step's in-step loads.
5. ``after_forward`` (``wait_for_save``): the forward's timer stops, in-step loads are
   finished and reported, and the stores of what the forward computed are queued.
6. ``finished`` (``get_finished``): loads vLLM's 0.26 never started (an empty step) are
   queued or failed, released requests wait for their stores, and finished loads and
   releases are reported.
7. ``report`` (``build_connector_worker_meta``): results, forward times, the start-up
   probe, the clocks and what the remote puts came to, for the scheduler half.
"""

from __future__ import annotations

from miniflex.plan import JobKind, JobResult, LoadProbe, PutOutcome, TransferPlan
from miniflex.worker.handler import MiniFlexHandler

__all__ = ["CLOCK_REPORT_S", "StepDriver", "WorkerReport"]

CLOCK_REPORT_S = 0.01
"""Hook and thread seconds worth a report on their own (else they wait for one)."""

WorkerReport = tuple[
    tuple[JobResult, ...],
    tuple[tuple[int, float], ...],
    tuple[LoadProbe, ...],
    float,
    float,
    PutOutcome,
]
"""``(results, step times, probes, hook seconds, thread CPU seconds, put outcome)`` of one
report."""


class StepDriver:
    """The worker's hooks of one engine step, for one rank's :class:`MiniFlexHandler`."""

    def __init__(self, handler: MiniFlexHandler) -> None:
        self.handler = handler
        self.hook_seconds = 0.0
        """Wall time in this side's hooks, not reported yet (the facade's clock adds it)."""
        self._thread_cpu = 0.0  # CPU time of the handler's threads, not reported yet
        self._puts = PutOutcome()  # what the remote puts came to, not reported yet

    def bound(self, plan: TransferPlan) -> None:
        self.handler.forward_started(plan)

    def preempted(self, plan: TransferPlan) -> None:
        self.handler.wait_for(plan.preempted)

    def before_forward(self, plan: TransferPlan) -> None:
        self.handler.wait_for(plan.preempted)
        self.handler.submit(plan, JobKind.LOAD)

    def layer(self, layer_name: str) -> None:
        self.handler.wait_layer(layer_name)

    def after_forward(self, plan: TransferPlan | None) -> None:
        """``plan`` None: a forward without MiniFlex metadata (vLLM calls the hook after
        every forward, a drafter's too); stores are only planned for steps that compute."""
        if plan is None:
            return
        self.handler.forward_issued(plan)
        self.handler.finish_step_loads()
        self.handler.submit(plan, JobKind.STORE)

    def finished(self, plan: TransferPlan | None) -> tuple[set[str] | None, set[str] | None]:
        """``(finished_sending, finished_recving)`` for vLLM (None where empty)."""
        if plan is not None:
            # 0.26 skips start_load_kv on empty steps; a load inside a step issued this
            # late (after the forward) is reported failed, never read unloaded.
            self.handler.submit(plan, JobKind.LOAD, before_forward=False)
            if not plan.forward:  # no wait_for_save may come: before the releases below
                self.handler.submit(plan, JobKind.STORE)
            self.handler.release_when_saved(plan)
        # Before the load errors are collected: with a drafter vLLM calls wait_for_save later.
        self.handler.finish_step_loads()
        sending, recving = self.handler.poll()
        return sending or None, recving or None

    def shutdown(self) -> None:
        self.handler.shutdown()

    def load_errors(self) -> tuple[set[int], set[str]]:
        """The blocks of the loads that failed since the last call, and their requests."""
        blocks, reqs = self.handler.take_load_errors()
        return set(blocks), set(reqs)

    def report(self) -> WorkerReport | None:
        """What the scheduler half gets this step; None while there is nothing worth sending
        (the clocks alone wait until they pass :data:`CLOCK_REPORT_S`)."""
        hook_seconds = self.hook_seconds
        results = self.handler.take_results()
        steps = self.handler.take_step_times()
        probe = self.handler.take_probe()
        probes = (probe,) if probe is not None else ()
        cpu = self._thread_cpu + self.handler.take_thread_cpu()
        puts = self._puts + self.handler.take_put_outcome()
        if not (results or steps or probes or puts) and hook_seconds + cpu < CLOCK_REPORT_S:
            self._thread_cpu, self._puts = cpu, puts
            return None
        self._thread_cpu = self.hook_seconds = 0.0
        self._puts = PutOutcome()
        return tuple(results), tuple(steps), probes, hook_seconds, cpu, puts
