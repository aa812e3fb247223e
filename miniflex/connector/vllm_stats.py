"""MiniFlex counters in vLLM's ``KVConnectorStats`` form (logged as "KV Transfer metrics")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from miniflex.connector.live_state import GAUGE_PREFIX
from miniflex.stats import CLOCKS

__all__ = ["MiniFlexConnectorStats"]


@dataclass
class MiniFlexConnectorStats(KVConnectorStats):
    """``data``: a flat dict of summable counters from ``TransferStats.as_counters``, and
    levels of the scheduler's state (``now_*`` keys, ``live_state.py``), which are not
    summed: the latest wins."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for key, value in other.data.items():
            gauge = key.startswith(GAUGE_PREFIX)
            self.data[key] = value if gauge else self.data.get(key, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        d: dict[str, Any] = self.data
        out: dict[str, int | float] = {k: v for k, v in d.items() if not k.endswith("_seconds")}
        for kind in ("load", "store", "demote"):
            n = d.get(f"{kind}s", 0)
            secs = d.get(f"{kind}_seconds", 0.0)
            out[f"{kind}_ms_avg"] = round(1e3 * secs / n, 3) if n else 0.0
            out[f"{kind}_GBps"] = round(d.get(f"{kind}_bytes", 0) / secs / 1e9, 3) if secs else 0.0
        held, held_s = d.get("blocks_held_requests", 0), d.get("blocks_held_seconds", 0.0)
        out["blocks_held_ms_avg"] = round(1e3 * held_s / held, 1) if held else 0.0
        for clock in CLOCKS:  # clocks.py
            out[clock.removesuffix("_seconds") + "_ms"] = round(1e3 * d.get(clock, 0.0), 1)
        return out

    def is_empty(self) -> bool:
        return not any(v or k.startswith(GAUGE_PREFIX) for k, v in self.data.items())
