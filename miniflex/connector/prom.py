"""MiniFlex's counters as Prometheus metrics on vLLM's ``/metrics`` endpoint.

vLLM sums the workers' and scheduler's ``KVConnectorStats`` per logging
interval and hands the dict to :meth:`MiniFlexPromMetrics.observe`; each
summable counter becomes a Prometheus counter, per-tier and per-kind ones
with a label::

    vllm:miniflex_hit_tokens_total{tier="ssd", ...}
    vllm:miniflex_transfer_bytes_total{kind="load", ...}
    vllm:miniflex_ssd_failures_total{op="read", ...}
    vllm:miniflex_time_taken_seconds_total{where="worker_hooks", ...}
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics

__all__ = ["MiniFlexPromMetrics"]

# counter name -> (documentation, label name or None, {stats key -> label value})
_METRICS: dict[str, tuple[str, str | None, dict[str, str]]] = {
    "vllm:miniflex_hit_tokens": (
        "Prompt tokens MiniFlex loaded instead of vLLM recomputing them, per tier.",
        "tier",
        {"hit_tokens_cpu": "cpu", "hit_tokens_ssd": "ssd"},
    ),
    "vllm:miniflex_stored_tokens": (
        "Prompt tokens MiniFlex saved to its CPU tier.",
        None,
        {"stored_tokens": ""},
    ),
    "vllm:miniflex_transfer_bytes": (
        "KV bytes MiniFlex moved: load (to vLLM), store (to CPU), demote (CPU to SSD).",
        "kind",
        {"load_bytes": "load", "store_bytes": "store", "demote_bytes": "demote"},
    ),
    "vllm:miniflex_transfer_seconds": (
        "Seconds MiniFlex's transfer jobs took, per kind.",
        "kind",
        {"load_seconds": "load", "store_seconds": "store", "demote_seconds": "demote"},
    ),
    "vllm:miniflex_ssd_failures": (
        "SSD chunks that failed a read (checksum, I/O: recomputed) or a write (not kept).",
        "op",
        {"ssd_read_failures": "read", "ssd_write_failures": "write"},
    ),
    "vllm:miniflex_ssd_chunks_recomputed": (
        "Chunks resident on SSD that the cost model chose to recompute.",
        None,
        {"ssd_chunks_recomputed": ""},
    ),
    "vllm:miniflex_time_taken_seconds": (
        "Time MiniFlex took from vLLM: wall time in its hooks on vLLM's scheduler and worker "
        "threads, and CPU time of its own transfer and SSD threads.",
        "where",
        {
            "scheduler_hook_seconds": "scheduler_hooks",
            "worker_hook_seconds": "worker_hooks",
            "thread_cpu_seconds": "threads",
        },
    ),
    "vllm:miniflex_failed_jobs": (
        "MiniFlex transfer jobs that failed (their blocks were recomputed).",
        None,
        {"failed_jobs": ""},
    ),
}


class MiniFlexPromMetrics(KVConnectorPromMetrics):
    """Registers MiniFlex's counters and increments them from each stats interval."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        # (engine, stats key) -> counter child with every label bound
        self._bound: dict[tuple[int, str], Any] = {}
        for name, (doc, label, keys) in _METRICS.items():
            names = labelnames + ([label] if label else [])
            counter = self._counter_cls(name=name, documentation=doc, labelnames=names)
            for engine, values in per_engine_labelvalues.items():
                for key, label_value in keys.items():
                    bound = [*values, label_value] if label else list(values)
                    self._bound[(engine, key)] = counter.labels(*bound)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, value in transfer_stats_data.items():
            child = self._bound.get((engine_idx, key))
            if child is not None and value:
                child.inc(value)
