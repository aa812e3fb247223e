"""MiniFlex's counters as Prometheus metrics on vLLM's ``/metrics`` endpoint.

vLLM sums the workers' and scheduler's ``KVConnectorStats`` per logging
interval and hands the dict to :meth:`MiniFlexPromMetrics.observe`; each
summable counter becomes a Prometheus counter, per-tier and per-kind ones
with a label::

    vllm:miniflex_hit_tokens_total{tier="ssd", ...}
    vllm:miniflex_transfer_bytes_total{kind="load", ...}
    vllm:miniflex_tier_bytes_total{tier="remote", op="read", ...}
    vllm:miniflex_decided_chunks_total{choice="recompute", ...}
    vllm:miniflex_ssd_failures_total{op="read", ...}
    vllm:miniflex_time_taken_seconds_total{where="worker_hooks", ...}
    vllm:miniflex_backfill_passes_total{...}

and the scheduler's state as gauges, updated while requests or transfers are in
flight (at most once a second) and once more when the engine falls idle::

    vllm:miniflex_slots{tier="cpu", state="pinned_or_moving", ...}
    vllm:miniflex_jobs_in_flight{...}
    vllm:miniflex_requests_tracked{...}
    vllm:miniflex_ssd_write_backlog_chunks{...}

A stats key may feed several metrics (``load_bytes`` is both a transfer's and the
CPU tier's read bytes). ``docs/grafana/miniflex.json`` is a dashboard of them.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics

from miniflex.connector.live_state import GAUGE_PREFIX, TIER_LEVELS

__all__ = ["MiniFlexPromMetrics"]

# counter name -> (documentation, label names, {stats key -> label values})
_METRICS: dict[str, tuple[str, tuple[str, ...], dict[str, tuple[str, ...]]]] = {
    "vllm:miniflex_hit_tokens": (
        "Prompt tokens MiniFlex loaded instead of vLLM recomputing them, per tier.",
        ("tier",),
        {"hit_tokens_cpu": ("cpu",), "hit_tokens_ssd": ("ssd",), "hit_tokens_remote": ("remote",)},
    ),
    "vllm:miniflex_stored_tokens": (
        "Prompt tokens MiniFlex saved to its CPU tier.",
        (),
        {"stored_tokens": ()},
    ),
    "vllm:miniflex_transfer_bytes": (
        "KV bytes MiniFlex moved: load (to vLLM), store (to CPU), demote (CPU to SSD).",
        ("kind",),
        {"load_bytes": ("load",), "store_bytes": ("store",), "demote_bytes": ("demote",)},
    ),
    "vllm:miniflex_tier_bytes": (
        "KV bytes into (write) and out of (read) each tier: CPU write is a store from vLLM, "
        "CPU read every load into vLLM's KV cache, SSD and remote reads the chunks a load "
        "fetched from them, SSD write demotions, remote write the puts; summed over ranks.",
        ("tier", "op"),
        {
            "store_bytes": ("cpu", "write"),
            "load_bytes": ("cpu", "read"),
            "demote_bytes": ("ssd", "write"),
            "ssd_read_bytes": ("ssd", "read"),
            "remote_put_bytes": ("remote", "write"),
            "remote_fetch_bytes": ("remote", "read"),
        },
    ),
    "vllm:miniflex_transfer_seconds": (
        "Seconds MiniFlex's transfer jobs took, per kind.",
        ("kind",),
        {"load_seconds": ("load",), "store_seconds": ("store",), "demote_seconds": ("demote",)},
    ),
    "vllm:miniflex_ssd_failures": (
        "SSD chunks that failed a read (checksum, I/O: recomputed) or a write (not kept).",
        ("op",),
        {"ssd_read_failures": ("read",), "ssd_write_failures": ("write",)},
    ),
    "vllm:miniflex_remote_chunks": (
        "Chunks of the remote store: fetched for a load (into a CPU slot, or streamed "
        "through a staging slot), failed a fetch (recomputed), or handed to write-through.",
        ("op",),
        {
            "remote_fetched_chunks": ("fetched",),
            "remote_streamed_chunks": ("streamed",),
            "remote_read_failures": ("fetch_failed",),
            "remote_puts": ("put",),
        },
    ),
    "vllm:miniflex_remote_puts": (
        "Remote puts, as the workers' puts ended (one per TP rank that puts its shard of a "
        "chunk): acknowledged by the store, held by it already (not sent), failed (refused, "
        "unreachable, or their job failed), or dropped unsent because remote_write_backlog "
        "was full.",
        ("outcome",),
        {
            "remote_puts_acked": ("acked",),
            "remote_puts_held": ("held",),
            "remote_puts_failed": ("failed",),
            "remote_puts_dropped": ("dropped",),
        },
    ),
    "vllm:miniflex_remote_put_wait_seconds": (
        "Seconds write-through puts waited for the same rank's fetches (loads go first).",
        (),
        {"remote_put_wait_seconds": ()},
    ),
    "vllm:miniflex_decided_chunks": (
        "Resident chunks the calibrated cost model chose to load, or to recompute because "
        "that was predicted faster.",
        ("choice",),
        {"decided_load_chunks": ("load",), "ssd_chunks_recomputed": ("recompute",)},
    ),
    "vllm:miniflex_ssd_chunks_recomputed": (
        "Chunks resident on SSD that the cost model chose to recompute.",
        (),
        {"ssd_chunks_recomputed": ()},
    ),
    "vllm:miniflex_time_taken_seconds": (
        "Time MiniFlex took from vLLM: wall time in its hooks on vLLM's scheduler and worker "
        "threads, and CPU time of its own transfer and SSD threads.",
        ("where",),
        {
            "scheduler_hook_seconds": ("scheduler_hooks",),
            "worker_hook_seconds": ("worker_hooks",),
            "thread_cpu_seconds": ("threads",),
        },
    ),
    "vllm:miniflex_failed_jobs": (
        "MiniFlex transfer jobs that failed (their blocks were recomputed).",
        (),
        {"failed_jobs": ()},
    ),
    "vllm:miniflex_blocks_held_requests": (
        "Finished requests whose KV blocks vLLM kept for MiniFlex (their last stores running, "
        "their chunks waiting for CPU slots on the way to SSD or the remote store, or, for "
        "an aborted request, its load still running), counted when vLLM got them back.",
        (),
        {"blocks_held_requests": ()},
    ),
    "vllm:miniflex_blocks_held_seconds": (
        "Seconds from each such request's finish until vLLM got its blocks back, summed.",
        (),
        {"blocks_held_seconds": ()},
    ),
    "vllm:miniflex_backfill_passes": (
        "Lookups that passed over a waiting request which did not fit in vLLM's KV cache, "
        "so that requests behind it that fit were scheduled first (backfill_s).",
        (),
        {"backfill_passes": ()},
    ),
}


# gauge name -> (documentation, label names, {stats key -> label values})
_GAUGES: dict[str, tuple[str, tuple[str, ...], dict[str, tuple[str, ...]]]] = {
    "vllm:miniflex_slots": (
        "Slots of MiniFlex's tiers by state: resident chunks, slots pinned by a load or being "
        "written (0 when idle), free slots.",
        ("tier", "state"),
        {
            f"{GAUGE_PREFIX}{tier}_{level}": (tier, level)
            for tier in ("cpu", "ssd")
            for level in TIER_LEVELS
        },
    ),
    "vllm:miniflex_jobs_in_flight": (
        "MiniFlex transfer jobs not finished yet (0 when idle).",
        (),
        {GAUGE_PREFIX + "jobs_in_flight": ()},
    ),
    "vllm:miniflex_requests_tracked": (
        "Requests MiniFlex's scheduler side holds state for (0 when idle).",
        (),
        {GAUGE_PREFIX + "requests_tracked": ()},
    ),
    "vllm:miniflex_ssd_write_backlog_chunks": (
        "Chunks on their way to the SSD tier, not reported written yet (0 when idle).",
        (),
        {GAUGE_PREFIX + "ssd_write_backlog": ()},
    ),
}


class MiniFlexPromMetrics(KVConnectorPromMetrics):
    """Registers MiniFlex's counters and gauges; counters are incremented from each stats
    interval, gauges set to the latest level."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._engines = per_engine_labelvalues
        # (engine, stats key) -> the metric children it feeds, with every label bound
        self._bound: dict[tuple[int, str], list[Any]] = {}
        for name, (doc, labels, keys) in _METRICS.items():
            counter = self._counter_cls(
                name=name, documentation=doc, labelnames=[*labelnames, *labels]
            )
            self._bind(counter, keys)
        for name, (doc, labels, values) in _GAUGES.items():
            gauge = self._gauge_cls(
                name=name,
                documentation=doc,
                labelnames=[*labelnames, *labels],
                multiprocess_mode="mostrecent",
            )
            self._bind(gauge, values)

    def _bind(self, metric: Any, keys: dict[str, tuple[str, ...]]) -> None:
        for engine, values in self._engines.items():
            for key, label_values in keys.items():
                child = metric.labels(*values, *label_values)
                self._bound.setdefault((engine, key), []).append(child)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, value in transfer_stats_data.items():
            for child in self._bound.get((engine_idx, key), ()):
                if key.startswith(GAUGE_PREFIX):
                    child.set(value)
                elif value:
                    child.inc(value)
