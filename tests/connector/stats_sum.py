"""What vLLM's stats loggers receive from MiniFlex, rebuilt and summed as its logging process
does (the scheduler's ``kv_connector_stats`` of every step the harness ran)."""

from __future__ import annotations

from collections.abc import Iterable
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
