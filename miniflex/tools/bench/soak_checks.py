"""What the soak checks of a server between rounds: idle levels, counters, its log.

At idle (every client answered), MiniFlex must hold nothing pinned or moving in
any tier, no job in flight and no request, and say so both on ``/metrics`` and
in its status file; :func:`wait_idle` measures how long after the last answer
both do. Counters (``/metrics``) tell which faults MiniFlex saw: checksum
failures on reads, failed writes, vLLM's preemptions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from miniflex.errors import ConfigError
from miniflex.tools.bench.http import parse_metrics
from miniflex.tools.bench.server import ServerProcess
from miniflex.tools.inspect_status import engine_liveness, load_status

__all__ = ["COUNTERS", "Idle", "counters", "wait_idle"]

COUNTERS = {
    "vllm:miniflex_ssd_failures_total": "op",
    "vllm:miniflex_hit_tokens_total": "tier",
    "vllm:miniflex_stored_tokens_total": None,
    "vllm:miniflex_failed_jobs_total": None,
    "vllm:num_preemptions_total": None,
}


@dataclass
class Idle:
    """The server's levels once idle, or as last seen when idle was not reached in time."""

    reached: bool
    after_s: float
    levels: dict[str, float] = field(default_factory=dict)
    liveness: str = ""

    def row(self) -> dict[str, Any]:
        return {"idle": self.reached, "idle_after_s": round(self.after_s, 2), **self.levels}


def counters(server: ServerProcess) -> dict[str, float]:
    """MiniFlex's and vLLM's counters of interest, by ``name[label]``, summed over engines."""
    m = parse_metrics(server.metrics())
    out: dict[str, float] = {}
    for name, label in COUNTERS.items():
        short = name.removeprefix("vllm:").removeprefix("miniflex_").removesuffix("_total")
        for labels, value in m.get(name, []):
            key = f"{short}_{labels[label]}" if label else short
            out[key] = out.get(key, 0.0) + value
    return out


def _levels(server: ServerProcess, status_file: str | None) -> dict[str, float]:
    """Everything that must be 0 at idle: /metrics' levels, and the status file's."""
    m = parse_metrics(server.metrics())
    out: dict[str, float] = {}
    for labels, value in m.get("vllm:miniflex_slots", []):
        if labels.get("state") == "pinned_or_moving":
            out[f"metrics_{labels['tier']}_pinned_or_moving"] = value
    for name in ("jobs_in_flight", "requests_tracked"):
        out[f"metrics_{name}"] = sum(v for _, v in m.get(f"vllm:miniflex_{name}", []))
    for name in ("num_requests_running", "num_requests_waiting"):
        out[name] = sum(v for _, v in m.get(f"vllm:{name}", []))
    if status_file is not None:
        try:
            s = load_status(status_file)
        except ConfigError:
            return {**out, "status_readable": 0.0}
        for tier in s["tiers"]:
            out[f"status_{tier['tier']}_pinned_or_moving"] = tier["pinned_or_moving"]
        out["status_jobs_in_flight"] = s["jobs_in_flight"]
        out["status_requests_tracked"] = s["requests_tracked"]
    return out


def wait_idle(server: ServerProcess, status_file: str | None, timeout_s: float = 10.0) -> Idle:
    """Poll until every level is 0 on /metrics and in the status file (``timeout_s`` at most)."""
    t0 = time.monotonic()
    while True:
        levels = _levels(server, status_file)
        reached = all(v == 0 for k, v in levels.items() if k != "status_readable")
        reached = reached and levels.get("status_readable", 1.0) == 1.0
        late = time.monotonic() - t0 > timeout_s
        if reached or late:
            live = engine_liveness(load_status(status_file)) if status_file else ""
            return Idle(reached, time.monotonic() - t0, levels, live)
        time.sleep(0.1)
