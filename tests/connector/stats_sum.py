"""What vLLM's stats loggers receive from MiniFlex, rebuilt and summed as its logging process
does (the scheduler's ``kv_connector_stats`` of every step the harness ran), and what its
``/metrics`` shows of them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from miniflex.connector import MiniFlexConnector


def summed_stats(kv_stats: Iterable[Any]) -> Any:
    """The connector stats object of all ``kv_stats`` together (``.data``, ``.reduce()``)."""
    stats = MiniFlexConnector.build_kv_connector_stats({})
    for data in kv_stats:
        stats.aggregate(MiniFlexConnector.build_kv_connector_stats(data))
    return stats


def totals(kv_stats: Iterable[Any]) -> dict[str, float]:
    """The summed counters by name."""
    return dict(summed_stats(kv_stats).data)


def prometheus_values(kv_stats: Iterable[Any], vllm_config: Any) -> Callable[..., float | None]:
    """MiniFlex's Prometheus metrics, fed ``kv_stats`` interval by interval as vLLM does, on a
    registry of their own: ``value(name, **labels)`` reads a sample (engine "0", model "m")."""
    import prometheus_client as prom

    registry = prom.CollectorRegistry()

    def on_registry(kind: type) -> type:
        def init(self: object, *args: object, **kwargs: object) -> None:
            kind.__init__(self, *args, registry=registry, **kwargs)  # type: ignore[misc]

        return type(kind.__name__, (kind,), {"__init__": init})

    types = {k: on_registry(k) for k in (prom.Gauge, prom.Counter, prom.Histogram)}
    metrics = MiniFlexConnector.build_prom_metrics(
        vllm_config, types, ["model_name", "engine"], {0: ["m", "0"]}
    )
    for data in kv_stats:
        metrics.observe(data, engine_idx=0)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"model_name": "m", "engine": "0", **labels})

    return value
