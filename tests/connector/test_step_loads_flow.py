"""Loads inside a step (load_mode sync, layerwise, auto) in vLLM's real Scheduler.

The harness's mover lands each layer of a layerwise load only when that layer
is waited for, so a forward that read a layer before its copy would read the
blocks' old bytes (``Harness.read_matches`` would fail).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import RequestStatus

from miniflex.plan import JobKind, LoadTiming
from tests.connector.engine_config import tokens
from tests.connector.harness import BLOCK, Harness, make_harness
from tests.connector.stats_sum import totals as summed_totals

CHUNK = 2 * BLOCK


def pinned(h: Harness) -> int:
    return h.manager_side.manager.cpu.usage().pinned_or_moving


def load_jobs(so: SchedulerOutput) -> list:
    return [j for j in so.kv_connector_metadata.plan.jobs if j.kind is JobKind.LOAD]


def counters(h: Harness) -> dict:
    return summed_totals(h.kv_stats)


@pytest.mark.parametrize(
    ("mode", "timing"), [("layerwise", LoadTiming.LAYERWISE), ("sync", LoadTiming.SYNC)]
)
def test_in_step_load_is_computed_in_the_same_step_from_the_exact_bytes(
    tmp_path: Path, mode: str, timing: LoadTiming
) -> None:
    h = make_harness(tmp_path / "model", load_mode=mode)
    prompt = tokens(1, 5 * CHUNK + 10)
    total = h.cached_in_miniflex_only("a", prompt)
    conn = h.manager_side
    b = h.add("b", prompt, max_tokens=2)
    assert conn.get_num_new_matched_tokens(b, 0) == (5 * CHUNK, False)
    h.mover.log.clear()
    so = h.step()
    assert [j.timing for j in load_jobs(so)] == [timing]
    # scheduled at once, with the loaded prefix counted as computed
    assert {r.req_id: r.num_computed_tokens for r in so.scheduled_new_reqs} == {"b": 5 * CHUNK}
    assert so.num_scheduled_tokens == {"b": 10}
    assert h.status("b") == RequestStatus.RUNNING
    assert h.read_matches(b, 5 * CHUNK // BLOCK)  # each layer read after its copy landed
    expected_order = {
        "layerwise": [("wait", 0), ("read", 0), ("wait", 1), ("read", 1)],
        "sync": [("wait", 0), ("wait", 1), ("read", 0), ("read", 1)],
    }
    assert h.mover.log == expected_order[mode]
    h.run()
    assert b.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert pinned(h) == 0 and h.free_blocks() == total
    data = counters(h)
    assert data["hit_tokens_cpu"] == 5 * CHUNK
    assert data[f"loads_{mode}"] == 1 and data["failed_jobs"] == 0
    assert data["load_bytes"] > 0


def test_failure_at_issue_becomes_load_errors_that_vllm_recomputes(tmp_path: Path) -> None:
    h = make_harness(tmp_path / "model", load_mode="layerwise")
    prompt = tokens(2, 4 * CHUNK + 5)
    total = h.cached_in_miniflex_only("a", prompt)
    h.mover.fail_layerwise = True
    b = h.add("b", prompt, max_tokens=2)
    so = h.step()
    assert so.num_scheduled_tokens == {"b": 5}  # scheduled on the promise of a load
    assert b.num_computed_tokens == 0  # vLLM rewound it: the load failed
    h.run()
    assert b.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert pinned(h) == 0 and h.free_blocks() == total
    assert counters(h)["failed_jobs"] == 1
    # the failed chunks were dropped and stored again from the recomputation
    c = h.add("c", prompt)
    assert h.manager_side.get_num_new_matched_tokens(c, 0)[0] == 4 * CHUNK


def test_in_step_load_of_a_request_finishing_in_its_first_step_frees_its_blocks(
    tmp_path: Path,
) -> None:
    h = make_harness(tmp_path / "model", load_mode="sync")
    prompt = tokens(3, 3 * CHUNK + 3)
    total = h.cached_in_miniflex_only("a", prompt)
    h.add("b", prompt, max_tokens=1)
    h.step()  # loaded, computed and finished in one step
    assert h.status("b") == RequestStatus.FINISHED_LENGTH_CAPPED
    # finished before vLLM handed over the step's load result: its hits are still complete
    params = h.params["b"]["miniflex"]
    assert params["hit_tokens"] == params["hit_tokens_cpu"] == 3 * CHUNK
    assert params["load"] == "sync"
    h.run()
    assert h.finished_and_freed("b") and pinned(h) == 0 and h.free_blocks() == total


def test_auto_loads_layerwise_until_the_load_dwarfs_the_prefill(tmp_path: Path) -> None:
    prompt = tokens(4, 4 * CHUNK + 5)
    # Uncalibrated: a hit held wholly in CPU goes layerwise.
    h = make_harness(tmp_path / "a", load_mode="auto")
    h.cached_in_miniflex_only("a", prompt)
    assert h.manager_side.get_num_new_matched_tokens(h.add("b", prompt), 0)[1] is False
    # A copy far slower than the prefill of 5 tokens: loading in the background wins.
    slow = {"cpu_load_gbps": 1e-6, "prefill_tokens_per_s": 1e9}
    h = make_harness(tmp_path / "b", load_mode="auto", extra=slow)
    h.cached_in_miniflex_only("a", prompt)
    b = h.add("b", prompt)
    assert h.manager_side.get_num_new_matched_tokens(b, 0) == (4 * CHUNK, True)
    so = h.step()
    assert [j.timing for j in load_jobs(so)] == [LoadTiming.ASYNC]
    assert h.status("b") == RequestStatus.WAITING_FOR_REMOTE_KVS
    h.run()
    assert counters(h)["loads_async"] == 1 and counters(h)["cost_decisions"] == 1


def test_async_mode_never_loads_inside_a_step(tmp_path: Path) -> None:
    h = make_harness(tmp_path / "model", load_mode="async", extra={"prefill_tokens_per_s": 1})
    prompt = tokens(5, 3 * CHUNK + 3)
    h.cached_in_miniflex_only("a", prompt)
    assert h.manager_side.get_num_new_matched_tokens(h.add("b", prompt), 0)[1] is True
