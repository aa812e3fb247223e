"""``miniflex inspect STATUS_FILE``: print what a running (or stopped) engine's MiniFlex holds.

The scheduler-side connector writes the file when ``status_file`` is
configured (docs/config.md). Example::

    MINIFLEX_STATUS_FILE=/tmp/miniflex.json miniflex serve ...
    miniflex inspect /tmp/miniflex.json
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from miniflex.errors import ConfigError
from miniflex.tools.table import format_table

__all__ = ["engine_liveness", "inspect_status", "load_status"]


def load_status(path: str | Path) -> dict[str, Any]:
    """The status JSON; ConfigError naming the file if it is missing or not a status file."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError("status file", str(path), f"a MiniFlex status file ({exc})") from None
    if not isinstance(data, dict) or "tiers" not in data or "cost_model" not in data:
        raise ConfigError("status file", str(path), "a MiniFlex status file (no tiers)")
    return data


def engine_liveness(status: dict[str, Any], now: float | None = None) -> str:
    """Whether the engine that wrote ``status`` runs, judged by its pid and the file's age.

    The engine rewrites the file every ``interval_s`` seconds, idle or not: a
    file much older than that, from a live pid, means a stuck engine.
    """
    now = time.time() if now is None else now
    pid, host = status.get("pid"), status.get("host")
    interval = float(status.get("interval_s", 2.0))
    age = now - float(status.get("written_at", 0))
    if host and host != socket.gethostname():
        return f"written on host {host}: whether its engine runs is not known here"
    if not isinstance(pid, int) or not _alive(pid):
        return f"engine not running (pid {pid} is gone): this is its last state"
    if age > 3 * interval + 1:
        return (
            f"engine pid {pid} runs but has not written for {age:.0f} s (every {interval:g} s "
            "when well): it may be stuck"
        )
    return "engine alive"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return True


def inspect_status(path: str | Path) -> str:
    """The status file as text: liveness and age, tiers, the cost model, cumulative counters."""
    s = load_status(path)
    now = time.time()
    age = now - float(s.get("written_at", 0))
    state_age = now - float(s.get("state_at", s.get("written_at", 0)))
    cm = s["cost_model"]
    prefill = cm.get("prefill")
    lines = [
        f"MiniFlex status of pid {s.get('pid')}: {engine_liveness(s, now)}",
        f"written {age:.1f} s ago; state from {state_age:.1f} s ago (refreshed while busy, "
        f"at most every {float(s.get('interval_s', 2.0)):g} s, and when idle); requests tracked "
        f"{s.get('requests_tracked')}, jobs in flight {s.get('jobs_in_flight')}",
        f"namespace {str(s.get('namespace', ''))[:12]}, {s.get('chunk_tokens')} tokens per chunk",
        "",
        format_table(s["tiers"]),
        "",
        f"cost model: hit_policy={cm['hit_policy']}, "
        f"{'calibrated' if cm['calibrated'] else 'not calibrated (loads everything resident)'}"
        f" after {cm['observed_steps']} steps",
        "  load GB/s: " + ", ".join(f"{t} {bw:.2f}" for t, bw in cm["load_GBps"].items()),
    ]
    if cm.get("layerwise_load_GBps") is not None:
        lines.append(f"  layerwise load GB/s: {cm['layerwise_load_GBps']:.2f}")
    if prefill:
        lines.append(
            f"  prefill: {1e3 * prefill['step_s']:.2f} ms + {1e6 * prefill['per_token_s']:.2f} "
            f"us/token + {1e9 * prefill['per_pair_s']:.3f} ns per query-key pair"
        )
    remote = s.get("remote")
    if remote:
        state = "down" if remote["down"] else "up"
        detail = ", ".join(f"{k} {v}" for k, v in remote.items() if k not in ("url", "down"))
        lines += ["", f"remote store {remote['url']}: {state}; {detail}"]
    totals = s.get("totals", {})
    if totals:
        lines += ["", format_table([{"counter": k, "total": v} for k, v in totals.items()])]
    return "\n".join(lines)
