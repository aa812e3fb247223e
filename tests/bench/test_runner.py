"""The workloads and the side-by-side runner on a fake engine: structure, hits, failures."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from miniflex.tools.bench.mixed import MixedWorkload
from miniflex.tools.bench.model import PromptMaker
from miniflex.tools.bench.overflow import OverflowWorkload
from miniflex.tools.bench.overhead import OverheadWorkload
from miniflex.tools.bench.runner import Candidate, Outputs, run_side_by_side
from miniflex.tools.bench.ttft import TTFTWorkload
from tests.bench.fake import FakeDriver

CAPACITY = 512
WORKLOADS = ("ttft", "overflow", "mixed", "overhead")
HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def _workloads() -> list:
    p = PromptMaker(1000, seed=1)
    return [
        TTFTWorkload(p, (100, 300), repeat=2, kv_bytes_per_token=1000, bandwidth_gbps=1.0),
        OverflowWorkload(p, prompt_tokens=128, ratios=(0.5, 2.0, 3.0)),
        MixedWorkload(
            p,
            prefixes=2,
            prefix_tokens=256,
            suffix_tokens=16,
            short_tokens=32,
            rate=50.0,
            requests=20,
            max_tokens=3,
        ),
        OverheadWorkload(
            p, batch_prompts=4, prompt_tokens=64, max_tokens=2, serial_prompts=2, rounds=2
        ),
    ]


def _broken() -> FakeDriver:
    raise RuntimeError("engine refused to start")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("bench")
    drivers: list[FakeDriver] = []

    def start(name: str, tier: bool):
        def make() -> FakeDriver:
            drivers.append(FakeDriver(name, CAPACITY, tier))
            return drivers[-1]

        return make

    candidates = [
        Candidate("apc", start("apc", False)),
        Candidate("native", None, "skipped: needs CUDA"),
        Candidate("miniflex-cpu", start("miniflex-cpu", True)),
        Candidate("broken", _broken),
    ]
    ok = run_side_by_side(_workloads(), candidates, Outputs(out, tag="t"), {"mode": "fake"}, print)
    assert not ok, "a configuration failed, so the run must say so"
    assert all(d.closed for d in drivers) and len(drivers) == 2
    return {w: json.loads((out / w / "t.json").read_text()) | {"dir": out} for w in WORKLOADS}


@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_workload_writes_json_rows_per_config_and_a_plot(results, workload) -> None:
    payload = results[workload]
    assert payload["workload"] == workload and payload["partial"] is False
    assert {
        "title",
        "params",
        "context",
        "rows",
        "summary",
        "skipped",
        "failed",
        "left_out",
        "engines",
        "samples",
    } <= payload.keys()
    assert payload["engines"] == []  # every configuration ran on one engine
    assert {r["config"] for r in payload["rows"]} == {"apc", "miniflex-cpu"}
    assert set(payload["samples"]) == {"apc", "miniflex-cpu"}
    assert payload["skipped"] == {"native": "skipped: needs CUDA"}
    assert "engine refused to start" in payload["failed"]["broken"]
    assert "lmcache" in payload["left_out"]
    png = payload["dir"] / workload / "t.png"  # beside its JSON: <out-dir>/<workload>/<tag>
    assert png.exists() == HAVE_MPL


def test_ttft_evicted_prompt_hits_the_tier_only_with_one(results) -> None:
    rows = {(r["config"], r["prompt_tokens"]): r for r in results["ttft"]["rows"]}
    assert rows[("apc", 300)]["ext_hit"] == 0 and rows[("apc", 300)]["vllm_hit"] == 0
    assert rows[("miniflex-cpu", 300)]["ext_hit"] == 288  # whole blocks before the last token
    assert rows[("miniflex-cpu", 300)]["tiers"] == "cpu=288"
    assert rows[("miniflex-cpu", 300)]["floor_ms"] == pytest.approx(
        300 * 1000 / 1e6 + rows[("miniflex-cpu", 300)]["gpu_hit_ms"], abs=0.1
    )
    assert "miniflex-cpu@300" in results["ttft"]["summary"]["speedup_vs_apc"]
    assert len(results["ttft"]["samples"]["apc"]) == 2 * 2 * 3  # lengths x repeats x steps


def test_overflow_apc_misses_past_capacity_and_the_tier_does_not(results) -> None:
    rows = {(r["config"], r["ratio"]): r for r in results["overflow"]["rows"]}
    assert rows[("apc", 0.5)]["miss_pct"] == 0.0
    assert rows[("apc", 2.0)]["miss_pct"] == 100.0 and rows[("apc", 3.0)]["miss_pct"] == 100.0
    for ratio in (0.5, 2.0, 3.0):
        assert rows[("miniflex-cpu", ratio)]["miss_pct"] == 0.0
    assert rows[("miniflex-cpu", 3.0)]["ext_hit"] == 112
    assert rows[("apc", 3.0)]["prompts"] == 12
    worst = results["overflow"]["summary"]["worst_miss_pct_past_capacity"]
    assert worst == {"apc": 100.0, "miniflex-cpu": 0.0}


def test_mixed_reports_each_class(results) -> None:
    rows = results["mixed"]["rows"]
    assert [r["class"] for r in rows if r["config"] == "apc"] == ["long", "short", "all"]
    by = {(r["config"], r["class"]): r for r in rows}
    assert by[("apc", "all")]["requests"] == 20
    assert (
        by[("miniflex-cpu", "long")]["ttft_p99_ms"] >= by[("miniflex-cpu", "long")]["ttft_p50_ms"]
    )


def test_overhead_compares_with_apc(results) -> None:
    vs = results["overhead"]["summary"]["vs_apc"]
    assert set(vs) == {"miniflex-cpu"}
    assert {"throughput_loss_pct", "best_round_loss_pct", "ttft_increase_pct"} == set(
        vs["miniflex-cpu"]
    )
    rows = results["overhead"]["rows"]
    assert all(r["cached"] == 0 for r in rows)  # nothing is reused
    for r in rows:  # the median of the rounds, never above the best one
        assert len(r["rounds_tok_per_s"]) == 2
        assert r["tok_per_s_median"] <= r["tok_per_s"] == max(r["rounds_tok_per_s"])


class Interrupted(FakeDriver):
    def prefill(self, tokens, label):  # type: ignore[override]
        raise KeyboardInterrupt


def test_an_interrupt_still_writes_what_was_measured(tmp_path: Path) -> None:
    interrupted = Interrupted("miniflex-cpu", CAPACITY, True)
    candidates = [
        Candidate("apc", lambda: FakeDriver("apc", CAPACITY, False)),
        Candidate("miniflex-cpu", lambda: interrupted),
        Candidate("never-started", _broken),
    ]
    workload = OverflowWorkload(PromptMaker(1000), prompt_tokens=128, ratios=(2.0,))
    ok = run_side_by_side([workload], candidates, Outputs(tmp_path), {}, print)
    assert not ok and interrupted.closed
    payload = json.loads((tmp_path / "overflow" / "run.json").read_text())  # no tag: "run"
    assert payload["partial"] is True and payload["failed"] == {}
    assert [r["config"] for r in payload["rows"]] == ["apc"]
