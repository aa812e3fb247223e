"""What MiniFlex costs a live engine: hook wall time and its threads' CPU time, as reported."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.connector.harness import BLOCK, Harness, make_harness

CHUNK = 2 * BLOCK
GATE_S = 0.3


def totals(h: Harness) -> dict[str, float]:
    """Every counter vLLM's stats loggers received, summed over the run."""
    out: dict[str, float] = {}
    for data in h.kv_stats:
        for key, value in data.items():
            out[key] = out.get(key, 0) + value
    return out


def test_every_side_reports_its_time_and_waits_cost_no_cpu(tmp_path: Path) -> None:
    """A store held up for 0.3 s by the disk-like gate takes 0.3 s of wall time, but its
    thread's CPU time stays far below that: a blocked wait is not counted as work. The
    hooks' wall time, on both sides, is reported too, and bounded by the run's."""
    h = make_harness(tmp_path / "model")
    prompt = [(i * 7919) % 997 + 3 for i in range(4 * CHUNK + 5)]
    t0 = time.perf_counter()
    h.mover.gate.clear()
    h.mover.store_entered.clear()
    h.add("a", prompt)
    h.step(wait_transfers=False)  # prefill: the stores wait at the gate
    assert h.mover.store_entered.wait(10)  # the store's clock runs: it is at the gate
    threading.Timer(GATE_S, h.mover.gate.set).start()
    h.run()
    assert h.sched.reset_prefix_cache()  # vLLM forgets the prompt: the next one hits MiniFlex
    h.add("b", prompt)
    h.run()
    wall = time.perf_counter() - t0

    t = totals(h)
    assert t["stores"] >= 1 and t["store_seconds"] >= GATE_S
    assert 0 < t["thread_cpu_seconds"] < GATE_S / 2
    assert 0 < t["scheduler_hook_seconds"] < wall
    assert 0 < t["worker_hook_seconds"] < wall
    assert t["hit_tokens_cpu"] == 4 * CHUNK
