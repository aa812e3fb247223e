"""``miniflex inspect STATUS_FILE``: print what a running (or stopped) engine's MiniFlex holds.

The scheduler-side connector writes the file when ``status_file`` is
configured (docs/config.md). Example::

    MINIFLEX_STATUS_FILE=/tmp/miniflex.json miniflex serve ...
    miniflex inspect /tmp/miniflex.json
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from miniflex.errors import ConfigError
from miniflex.table import format_table

__all__ = ["inspect_status", "load_status"]


def load_status(path: str | Path) -> dict[str, Any]:
    """The status JSON; ConfigError naming the file if it is missing or not a status file."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError("status file", str(path), f"a MiniFlex status file ({exc})") from None
    if not isinstance(data, dict) or "tiers" not in data or "cost_model" not in data:
        raise ConfigError("status file", str(path), "a MiniFlex status file (no tiers)")
    return data


def inspect_status(path: str | Path) -> str:
    """The status file as text: tiers, the cost model, and cumulative counters."""
    s = load_status(path)
    age = time.time() - float(s.get("written_at", 0))
    cm = s["cost_model"]
    prefill = cm.get("prefill")
    lines = [
        f"MiniFlex status of pid {s.get('pid')}, written {age:.0f} s ago; namespace "
        f"{str(s.get('namespace', ''))[:12]}, {s.get('chunk_tokens')} tokens per chunk",
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
    totals = s.get("totals", {})
    if totals:
        lines += ["", format_table([{"counter": k, "total": v} for k, v in totals.items()])]
    return "\n".join(lines)
