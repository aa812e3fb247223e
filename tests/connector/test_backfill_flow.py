"""Backfill inside vLLM's real Scheduler: a request that fits goes ahead of one that does
not, the one passed over is admitted when room appears, and ``backfill_s`` bounds it."""

from __future__ import annotations

import time
from pathlib import Path

from tests.connector.engine_config import tokens
from tests.connector.harness import BLOCK, Harness, make_harness
from tests.connector.stats_sum import prometheus_values, summed_stats

PREFIX = tokens(1, 20 * BLOCK)


def scheduled(h: Harness) -> set[str]:
    return set(h.step().num_scheduled_tokens)


def start(tmp_path: Path, backfill_s: float) -> Harness:
    """64 blocks: "long" runs on a 21-block prompt; "cold" (50 blocks) cannot fit beside it;
    "shares", queued after "cold", needs 1 block beyond the prefix it shares with "long"."""
    h = make_harness(tmp_path / "model", extra={"backfill_s": backfill_s})
    h.add("long", PREFIX + tokens(2, 8), max_tokens=40)
    assert scheduled(h) == {"long"}
    h.add("cold", tokens(3, 50 * BLOCK), max_tokens=1)
    h.add("shares", PREFIX + tokens(4, 8), max_tokens=1)
    return h


def test_a_request_that_fits_goes_ahead_of_one_that_does_not(tmp_path: Path) -> None:
    h = start(tmp_path, 5.0)
    assert scheduled(h) == {"long"}  # "cold" is tried, does not fit, and holds this step
    assert "shares" in scheduled(h)  # then it is passed over: "shares" fits beside "long"
    passes = summed_stats(h.kv_stats).data["backfill_passes"]  # as vLLM's loggers get it
    value = prometheus_values(h.kv_stats, h.sched.vllm_config)
    assert passes >= 1 and value("vllm:miniflex_backfill_passes_total") == passes
    while "long" in h.sched.requests:
        assert "cold" not in scheduled(h)
    for _ in range(3):  # "long" ended: "cold" tries again, and now fits
        if "cold" in scheduled(h):
            break
    else:
        raise AssertionError("the request passed over was not admitted when room appeared")
    h.run()


def test_zero_keeps_vllms_order(tmp_path: Path) -> None:
    h = start(tmp_path, 0.0)
    for _ in range(10):  # "shares" waits behind "cold", as vLLM orders them
        assert scheduled(h) == {"long"}
    h.run()
    assert summed_stats(h.kv_stats).data.get("backfill_passes", 0) == 0


def test_past_backfill_s_the_request_holds_the_queue_again(tmp_path: Path) -> None:
    h = start(tmp_path, 0.05)
    assert scheduled(h) == {"long"}
    time.sleep(0.1)
    for _ in range(5):
        assert scheduled(h) == {"long"}  # "cold" waited long enough: "shares" waits behind
    h.run()
