"""The two objects vLLM carries between MiniFlex's halves, wrapping frozen plans/results."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

from miniflex.plan import JobResult, LoadProbe, PutOutcome, TransferPlan

if TYPE_CHECKING:
    from miniflex.worker.step_driver import WorkerReport

__all__ = ["MiniFlexMetadata", "MiniFlexWorkerMeta"]


@dataclass(frozen=True)
class MiniFlexMetadata(KVConnectorMetadata):
    """Scheduler -> workers, once per engine step."""

    plan: TransferPlan


@dataclass(frozen=True)
class MiniFlexWorkerMeta(KVConnectorWorkerMetadata):
    """Worker -> scheduler: jobs finished since the last step (one entry per rank)."""

    results: tuple[JobResult, ...]
    step_seconds: tuple[tuple[int, float], ...] = ()
    """``(step, forward seconds)`` measured by the worker (the cost model's prefill fit)."""
    probes: tuple[LoadProbe, ...] = ()
    """The start-up load probe, in the worker's first report."""
    hook_seconds: float = 0.0
    """Wall seconds in the worker's hooks since its last report (``clocks.py``)."""
    thread_cpu_seconds: float = 0.0
    """CPU seconds of the worker's transfer and SSD threads since its last report."""
    puts: PutOutcome = field(default_factory=PutOutcome)
    """What the worker's remote puts came to since its last report."""

    @classmethod
    def of(cls, report: WorkerReport | None) -> MiniFlexWorkerMeta | None:
        """The worker half's report (:meth:`StepDriver.report`), if it has one."""
        return cls(*report) if report is not None else None

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, MiniFlexWorkerMeta), type(other)
        return MiniFlexWorkerMeta(
            self.results + other.results,
            self.step_seconds + other.step_seconds,
            self.probes + other.probes,
            self.hook_seconds + other.hook_seconds,
            self.thread_cpu_seconds + other.thread_cpu_seconds,
            self.puts + other.puts,
        )
