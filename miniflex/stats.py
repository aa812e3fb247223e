"""Transfer counters: what MiniFlex hit, stored and moved (no vLLM dependency).

The connector wraps these in vLLM's ``KVConnectorStats`` so that they reach
vLLM's logging and metrics; ``as_counters`` is the wire and log format.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from miniflex.plan import JobKind, JobResult, PutOutcome

__all__ = ["CLOCKS", "TransferStats"]

CLOCKS = ("scheduler_hook_seconds", "worker_hook_seconds", "thread_cpu_seconds")
"""The counters of time taken from vLLM (``clocks.py``)."""


@dataclass
class TransferStats:
    """Counters since the last reset; ``merge`` adds another instance in place."""

    hit_tokens: Counter[str] = field(default_factory=Counter)  # per tier name
    ssd_jobs: Counter[str] = field(default_factory=Counter)  # per SSD I/O backend name
    load_timing: Counter[str] = field(default_factory=Counter)  # loads sent, per LoadTiming
    stored_tokens: int = 0
    load_bytes: int = 0
    store_bytes: int = 0
    load_seconds: float = 0.0
    store_seconds: float = 0.0
    loads: int = 0
    stores: int = 0
    failed_jobs: int = 0
    stores_skipped: int = 0
    demotes: int = 0
    demote_bytes: int = 0
    demote_seconds: float = 0.0
    promoted_chunks: int = 0  # read SSD -> CPU for a load
    streamed_chunks: int = 0  # read SSD -> a staging slot for a load, past the CPU tier
    demoted_chunks: int = 0  # written CPU -> SSD (write-back or write-through)
    demotions_skipped: int = 0  # evicted from CPU unwritten: ssd_write_backlog was full
    demotions_declined: int = 0  # evicted from CPU unwritten: the disk is slower than recompute
    ssd_read_failures: int = 0  # checksum mismatch or I/O error: recomputed, dropped
    ssd_write_failures: int = 0  # disk full or I/O error: the chunk is not kept on SSD
    cost_decisions: int = 0  # loads decided by the calibrated cost model
    ssd_chunks_recomputed: int = 0  # resident on SSD, recomputed because that was faster
    remote_fetched_chunks: int = 0  # read remote store -> CPU for a load
    remote_streamed_chunks: int = 0  # read remote store -> a staging slot, past the CPU tier
    remote_read_failures: int = 0  # missing, unreachable or corrupt on fetch: recomputed
    backfill_passes: int = 0  # lookups that passed over a request that did not fit (backfill)
    remote_puts: int = 0  # chunks handed to the workers' write-through to the remote store
    ssd_read_bytes: int = 0  # read from SSD for a load (promoted or streamed), all ranks
    remote_fetch_bytes: int = 0  # fetched from the remote store for a load, all ranks
    remote_put_bytes: int = 0  # handed to the remote store's puts, all ranks
    # what the puts came to, per rank that puts (each TP rank puts its shard of a chunk):
    remote_puts_acked: int = 0  # put and acknowledged by the store
    remote_puts_held: int = 0  # not sent: the store held them already
    remote_puts_failed: int = 0  # refused, unreachable, or their job failed
    remote_puts_dropped: int = 0  # dropped unsent: remote_write_backlog was full
    remote_put_wait_seconds: float = 0.0  # puts waited for the same rank's fetches, all ranks
    decided_load_chunks: int = 0  # resident chunks the cost model chose to load
    blocks_held_requests: int = 0  # finished requests whose blocks vLLM kept for MiniFlex
    blocks_held_seconds: float = 0.0  # from each such finish to its blocks' release, summed
    ttft_samples: int = 0  # decided requests whose TTFT was measured
    ttft_predicted_s: float = 0.0
    ttft_actual_s: float = 0.0
    # Time taken from vLLM (clocks.py): never a reason to report on their own.
    scheduler_hook_seconds: float = 0.0  # wall time in the scheduler-side hooks
    worker_hook_seconds: float = 0.0  # wall time in the worker-side hooks, all ranks
    thread_cpu_seconds: float = 0.0  # CPU time of MiniFlex's threads, all ranks

    _SUMMED = (
        "stored_tokens",
        "load_bytes",
        "store_bytes",
        "load_seconds",
        "store_seconds",
        "loads",
        "stores",
        "failed_jobs",
        "stores_skipped",
        "demotes",
        "demote_bytes",
        "demote_seconds",
        "promoted_chunks",
        "streamed_chunks",
        "demoted_chunks",
        "demotions_skipped",
        "demotions_declined",
        "ssd_read_failures",
        "ssd_write_failures",
        "cost_decisions",
        "ssd_chunks_recomputed",
        "remote_fetched_chunks",
        "remote_streamed_chunks",
        "remote_read_failures",
        "remote_puts",
        "ssd_read_bytes",
        "remote_fetch_bytes",
        "remote_put_bytes",
        "remote_puts_acked",
        "remote_puts_held",
        "remote_puts_failed",
        "remote_puts_dropped",
        "remote_put_wait_seconds",
        "decided_load_chunks",
        "blocks_held_requests",
        "blocks_held_seconds",
        "backfill_passes",
        "ttft_samples",
        "ttft_predicted_s",
        "ttft_actual_s",
        "scheduler_hook_seconds",
        "worker_hook_seconds",
        "thread_cpu_seconds",
    )

    def add_result(self, r: JobResult) -> None:
        if r.kind is JobKind.LOAD:
            self.loads += 1
            self.load_bytes += r.num_bytes
            self.load_seconds += r.seconds
        elif r.kind is JobKind.STORE:
            self.stores += 1
            self.store_bytes += r.num_bytes
            self.store_seconds += r.seconds
        elif r.kind is JobKind.DEMOTE:
            self.demotes += 1
            self.demote_bytes += r.num_bytes
            self.demote_seconds += r.seconds

        if r.io:
            self.ssd_jobs[r.io] += 1

    def add_puts(self, p: PutOutcome) -> None:
        """What the workers' remote puts came to (:class:`PutOutcome`)."""
        self.remote_puts_acked += p.acked
        self.remote_puts_held += p.held
        self.remote_puts_failed += p.failed
        self.remote_puts_dropped += p.dropped
        self.remote_put_wait_seconds += p.wait_seconds

    def add_held(self, requests: int, seconds: float) -> None:
        """``requests`` finished requests whose blocks vLLM kept for MiniFlex were released,
        ``seconds`` after they finished in all (:mod:`miniflex.connector.held_blocks`)."""
        self.blocks_held_requests += requests
        self.blocks_held_seconds += seconds

    def merge(self, other: TransferStats) -> TransferStats:
        self.hit_tokens.update(other.hit_tokens)
        self.ssd_jobs.update(other.ssd_jobs)
        self.load_timing.update(other.load_timing)
        for name in self._SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self

    def is_empty(self) -> bool:
        """Nothing happened but time passing: the clocks ride along with the next report."""
        if self.hit_tokens or self.ssd_jobs or self.load_timing:
            return False
        return not any(getattr(self, name) for name in _COUNTED)

    def as_counters(self) -> dict[str, int | float]:
        """Flat summable counters (the ``KVConnectorStats.data`` payload)."""
        out: dict[str, int | float] = {f"hit_tokens_{t}": n for t, n in self.hit_tokens.items()}
        out.update({f"ssd_jobs_{name}": n for name, n in self.ssd_jobs.items()})
        out.update({f"loads_{name}": n for name, n in self.load_timing.items()})
        for name in self._SUMMED:
            out[name] = getattr(self, name)
        return out


_COUNTED = tuple(n for n in TransferStats._SUMMED if n not in CLOCKS)
"""The summed counters that are events, not time (read after every engine step)."""
