"""Transfer counters: what MiniFlex hit, stored and moved (no vLLM dependency).

The connector wraps these in vLLM's ``KVConnectorStats`` so that they reach
vLLM's logging and metrics; ``as_counters`` is the wire and log format.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from miniflex.plan import JobKind, JobResult

__all__ = ["TransferStats"]


@dataclass
class TransferStats:
    """Counters since the last reset; ``merge`` adds another instance in place."""

    hit_tokens: Counter[str] = field(default_factory=Counter)  # per tier name
    stored_tokens: int = 0
    load_bytes: int = 0
    store_bytes: int = 0
    load_seconds: float = 0.0
    store_seconds: float = 0.0
    loads: int = 0
    stores: int = 0
    failed_jobs: int = 0
    stores_skipped: int = 0

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
    )

    def add_result(self, r: JobResult) -> None:
        if r.kind is JobKind.LOAD:
            self.loads += 1
            self.load_bytes += r.num_bytes
            self.load_seconds += r.seconds
        else:
            self.stores += 1
            self.store_bytes += r.num_bytes
            self.store_seconds += r.seconds

    def merge(self, other: TransferStats) -> TransferStats:
        self.hit_tokens.update(other.hit_tokens)
        for name in self._SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self

    def is_empty(self) -> bool:
        return self == TransferStats()

    def as_counters(self) -> dict[str, int | float]:
        """Flat summable counters (the ``KVConnectorStats.data`` payload)."""
        out: dict[str, int | float] = {f"hit_tokens_{t}": n for t, n in self.hit_tokens.items()}
        for name in self._SUMMED:
            out[name] = getattr(self, name)
        return out
