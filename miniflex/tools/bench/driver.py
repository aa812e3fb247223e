"""The interface every workload runs against: one engine configuration, started or remote.

Two implementations: :class:`~miniflex.tools.bench.offline_driver.OfflineDriver` starts
vLLM's ``LLM`` in this process (one configuration at a time, shut down before
the next), :class:`~miniflex.tools.bench.http.HttpDriver` drives an OpenAI-compatible
server that is already running. Workloads only see this interface, so each
workload works in both modes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from miniflex.tools.bench.samples import Sample

__all__ = ["Arrival", "Driver", "taken_ms"]


@dataclass(frozen=True)
class Arrival:
    """An open-loop request: sent ``at_s`` seconds after the run starts, whatever came before."""

    at_s: float
    tokens: Sequence[int]
    max_tokens: int
    label: str


class Driver(ABC):
    """One engine configuration under test; called from the benchmark's one thread."""

    name: str
    capacity_tokens: int
    """Tokens vLLM's own KV cache holds (GPU blocks x block size)."""

    @abstractmethod
    def prefill(self, tokens: Sequence[int], label: str) -> Sample:
        """Send one request alone with ``max_tokens=1`` and wait for it; its TTFT and hits.

        Hits are exact here: no other request runs at the same time.
        """

    @abstractmethod
    def open_loop(self, arrivals: Sequence[Arrival]) -> tuple[list[Sample], float]:
        """Send every arrival at its time, without waiting for earlier ones to finish.

        Returns the samples (TTFT counted from the scheduled arrival, so time
        spent queued on the client side counts too) and the makespan in
        seconds, from the first arrival to the last completion. Per-request
        connector hits may be ``None`` here when the engine reports them only
        as a global counter.
        """

    @abstractmethod
    def evict_gpu(self) -> None:
        """Make vLLM's own prefix cache forget every prompt; tiers below keep theirs.

        Offline: ``reset_prefix_cache()``. Against a server: unique filler
        prompts worth more than the KV capacity.
        """

    @abstractmethod
    def reset(self) -> bool:
        """Forget everything cached, vLLM's and the connector's; False: not possible here.

        Workloads use fresh prompts for each measurement anyway, so a driver
        that cannot reset only leaves older chunks competing for tier space.
        """

    def time_taken(self) -> dict[str, float] | None:
        """MiniFlex's cumulative ``vllm:miniflex_time_taken_seconds`` counters by ``where``
        (``scheduler_hooks``, ``worker_hooks``, ``threads``); None where not known."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release the engine (shut it down, when this driver started it)."""


def taken_ms(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> tuple[float, float] | None:
    """(hook wall ms, thread CPU ms) between two readings of ``Driver.time_taken``; None where
    the driver does not know them (not MiniFlex, or a server without its metrics)."""
    if before is None or after is None:
        return None

    def delta(where: str) -> float:
        return 1e3 * (after.get(where, 0.0) - before.get(where, 0.0))

    return delta("scheduler_hooks") + delta("worker_hooks"), delta("threads")
