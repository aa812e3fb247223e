"""The status file and ``miniflex inspect``: what an operator sees of a live engine."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from vllm.v1.request import RequestStatus

from miniflex.errors import ConfigError
from miniflex.tools.cli import main
from miniflex.tools.inspect_status import engine_liveness, inspect_status, load_status
from tests.connector.harness import BLOCK, make_harness
from tests.connector.stats_sum import prometheus_values

CHUNK = 2 * BLOCK


def test_status_file_shows_tiers_cost_model_and_totals(
    tmp_path: Path, direct_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = tmp_path / "status.json"
    h = make_harness(
        tmp_path / "model",
        extra={"status_file": str(status), "ssd_dirs": str(direct_dir), "ssd_bytes": "1MiB"},
    )
    prompt = [(i * 104729) % 997 + 3 for i in range(5 * CHUNK + 10)]
    h.cached_in_miniflex_only("a", prompt)
    h.add("b", prompt)
    h.run()
    h.worker.shutdown()
    h.manager_side.shutdown()  # writes the final state

    data = load_status(status)
    tiers = {t["tier"]: t for t in data["tiers"]}
    assert tiers["cpu"]["resident"] == 5 and tiers["ssd"]["slots"] == 256
    assert data["totals"]["hit_tokens_cpu"] == 5 * CHUNK
    assert data["totals"]["stored_tokens"] == 5 * CHUNK
    assert data["cost_model"]["observed_steps"] >= 1

    assert main(["inspect", str(status)]) == 0
    out = capsys.readouterr().out
    assert "cost model: hit_policy=cost" in out and "hit_tokens_cpu" in out
    assert inspect_status(status).splitlines()[0].startswith("MiniFlex status of pid")


def written_after(path: Path, since: float) -> dict:
    """The status file once it holds a state taken after ``since`` (the timer writes every
    second; 5 s at most)."""
    deadline = time.monotonic() + 5
    while True:
        data = load_status(path)
        if data["state_at"] > since and data["written_at"] > since:
            return data
        assert time.monotonic() < deadline, f"no state after {since} in {data}"
        time.sleep(0.05)


def rewritten(path: Path, after: float) -> dict:
    """The status file once it was written again after ``after`` (5 s at most)."""
    deadline = time.monotonic() + 5
    while (data := load_status(path))["written_at"] <= after:
        assert time.monotonic() < deadline, "the status file was not rewritten"
        time.sleep(0.05)
    return data


def test_the_idle_state_is_written_on_a_timer_without_engine_steps(
    tmp_path: Path, direct_dir: Path
) -> None:
    """The last snapshot is the one after the step that ended the last transfer (nothing
    pinned, no job in flight), and the file keeps being rewritten while nothing happens."""
    status = tmp_path / "status.json"
    h = make_harness(
        tmp_path / "model",
        extra={"status_file": str(status), "ssd_dirs": str(direct_dir), "ssd_bytes": "1MiB"},
    )
    try:
        prompt = [(i * 7877) % 997 + 3 for i in range(6 * CHUNK + 5)]
        h.mover.gate.clear()  # transfers wait: the stores stay pinned and in flight
        h.add("a", prompt)
        h.step(wait_transfers=False)
        time.sleep(1.1)  # while busy, a snapshot is taken at most once a second
        since = time.time()
        h.step(wait_transfers=False)
        busy = written_after(status, since)
        assert busy["jobs_in_flight"] > 0 and busy["tiers"][0]["pinned_or_moving"] == 6, busy
        h.mover.gate.set()
        since = time.time()
        h.run()
        idle = written_after(status, since)
        again = rewritten(status, idle["written_at"])  # no engine step in between
        assert again["state_at"] == idle["state_at"]
        assert idle["jobs_in_flight"] == 0 and idle["requests_tracked"] == 0
        assert all(t["pinned_or_moving"] == 0 for t in idle["tiers"]), idle["tiers"]
        assert idle["tiers"][0]["resident"] == 6  # the chunks it stored stay
        assert engine_liveness(idle) == "engine alive"
        last = h.kv_stats[-1]  # what /metrics got last: the same idle levels
        assert last["now_cpu_pinned_or_moving"] == 0 and last["now_jobs_in_flight"] == 0
        assert last["now_cpu_resident"] == 6 and last["now_ssd_pinned_or_moving"] == 0
        assert idle["ssd_write_backlog"] == 0 and last["now_ssd_write_backlog"] == 0
    finally:
        h.mover.gate.set()
        h.worker.shutdown()
        h.manager_side.shutdown()


def test_inspect_tells_a_dead_or_stuck_engine_from_a_live_one() -> None:
    now = time.time()
    me = {"pid": os.getpid(), "host": os.uname().nodename, "interval_s": 1.0}
    assert engine_liveness({**me, "written_at": now - 0.5}, now) == "engine alive"
    stuck = engine_liveness({**me, "written_at": now - 60}, now)
    assert "has not written for 60 s" in stuck and "stuck" in stuck
    dead = engine_liveness({**me, "pid": 2**22 + 12345, "written_at": now - 60}, now)
    assert dead.startswith("engine not running (pid") and "last state" in dead
    elsewhere = engine_liveness({**me, "host": "elsewhere.example", "written_at": now}, now)
    assert "not known here" in elsewhere


def test_inspect_refuses_what_is_not_a_status_file(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ConfigError, match="status file"):
        load_status(other)
    assert main(["inspect", str(tmp_path / "missing.json")]) == 2


def test_prometheus_counters_follow_the_stats_vllm_reports(tmp_path: Path) -> None:
    h = make_harness(tmp_path / "model")
    prompt = [(i * 7919) % 997 + 3 for i in range(5 * CHUNK + 10)]
    h.cached_in_miniflex_only("a", prompt)
    h.add("b", prompt)
    h.run()
    value = prometheus_values(h.kv_stats, h.sched.vllm_config)
    assert value("vllm:miniflex_hit_tokens_total", tier="cpu") == 5 * CHUNK
    assert value("vllm:miniflex_hit_tokens_total", tier="ssd") == 0
    assert value("vllm:miniflex_stored_tokens_total") == 5 * CHUNK
    assert value("vllm:miniflex_slots", tier="cpu", state="resident") == 5
    assert value("vllm:miniflex_slots", tier="cpu", state="pinned_or_moving") == 0
    assert value("vllm:miniflex_jobs_in_flight") == 0
    assert value("vllm:miniflex_requests_tracked") == 0
    assert (value("vllm:miniflex_transfer_bytes_total", kind="load") or 0) > 0
    for where in ("scheduler_hooks", "worker_hooks", "threads"):
        assert (value("vllm:miniflex_time_taken_seconds_total", where=where) or 0) > 0, where


def test_a_request_that_ends_between_steps_still_reaches_metrics(tmp_path: Path) -> None:
    """vLLM sends stats only from a step: after an abort between steps left the engine idle,
    MiniFlex asks for one more step, whose stats carry the idle levels."""
    h = make_harness(tmp_path / "model")
    h.add("a", [(i * 7919) % 997 + 3 for i in range(3 * CHUNK + 5)], max_tokens=100)
    for _ in range(3):
        h.step()  # the prompt is computed and stored; it decodes
    h.sched.finish_requests("a", RequestStatus.FINISHED_ABORTED)  # the client hung up
    assert h.manager_side.has_pending_push_work()
    h.step()
    assert h.kv_stats[-1]["now_requests_tracked"] == 0
    assert h.kv_stats[-1]["now_jobs_in_flight"] == 0
    assert not h.manager_side.has_pending_push_work()
