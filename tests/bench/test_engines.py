"""Configurations run on several engines: the mean, spread and ratio table, and the runner's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from miniflex.tools.bench.engines import Measure, between_engines, configuration
from miniflex.tools.bench.model import PromptMaker
from miniflex.tools.bench.overflow import OverflowWorkload
from miniflex.tools.bench.runner import Candidate, Outputs, run_side_by_side
from tests.bench.fake import FakeDriver

TTFT, TOKS = Measure("ttft_ms"), Measure("tok_s", higher_is_better=True)


def _row(config: str, n: int, ttft: float | None, tok_s: float) -> dict:
    return {"config": config, "n": n, "ttft_ms": ttft, "tok_s": tok_s}


def test_configuration_drops_only_the_repeat() -> None:
    assert configuration("miniflex-cpu#2") == "miniflex-cpu"
    assert configuration("miniflex-ssd+store=false#3") == "miniflex-ssd+store=false"
    assert configuration("apc") == "apc"


def test_no_table_when_every_configuration_ran_once() -> None:
    rows = [_row("a", 1, 10.0, 100.0), _row("b", 1, 5.0, 200.0)]
    assert between_engines(rows, ("n",), (TTFT, TOKS)) == []
    assert between_engines([*rows, _row("a#2", 1, 12.0, 90.0)], ("n",), ()) == []


def test_mean_spread_and_ratio_oriented_so_above_one_is_better() -> None:
    rows = [
        _row("cpu", 1, 10.0, 100.0),
        _row("ssd", 1, 12.0, 80.0),
        _row("cpu#2", 1, 14.0, 100.0),
        _row("ssd#2", 1, 12.0, 120.0),
    ]
    got = {(r["config"], r["measure"]): r for r in between_engines(rows, ("n",), (TTFT, TOKS))}
    cpu, ssd = got[("cpu", "ttft_ms")], got[("ssd", "ttft_ms")]
    assert (cpu["engines"], cpu["mean"], cpu["spread_x"], cpu["vs_first"]) == (2, 12.0, 1.4, 1.0)
    assert (ssd["mean"], ssd["spread_x"], ssd["vs_first"]) == (12.0, 1.0, 1.0)
    assert got[("ssd", "tok_s")]["vs_first"] == 1.0 and got[("ssd", "tok_s")]["spread_x"] == 1.5
    faster = between_engines([*rows[:2], _row("cpu#2", 1, 10.0, 100.0)], ("n",), (TTFT, TOKS))
    by = {(r["config"], r["measure"]): r["vs_first"] for r in faster}
    assert by[("ssd", "ttft_ms")] == pytest.approx(10 / 12, abs=1e-3)  # slower: below 1
    assert by[("ssd", "tok_s")] == 0.8  # less throughput: below 1


def test_rows_are_grouped_by_measure_case_configuration_and_gaps_are_left_out() -> None:
    rows = [
        _row("a", 1, 10.0, 1.0),
        _row("a", 2, 20.0, 1.0),
        _row("b", 1, None, 1.0),  # a measure this engine could not report
        _row("b", 2, 40.0, 1.0),
        _row("a#2", 1, 30.0, 1.0),
        _row("a#2", 2, 20.0, 1.0),
    ]
    got = between_engines(rows, ("n",), (TTFT,))
    assert [(r["config"], r["n"]) for r in got] == [("a", 1), ("a", 2), ("b", 2)]
    assert [r["mean"] for r in got] == [20.0, 20.0, 40.0]
    assert got[-1]["vs_first"] == 0.5 and got[-1]["engines"] == 1


class Slow(FakeDriver):
    """The fake engine, 1.5 times slower on every request."""

    def _serve(self, tokens, label, at, max_tokens):  # type: ignore[override]
        s = super()._serve(tokens, label, at, max_tokens)
        return dataclasses.replace(s, ttft_ms=1.5 * s.ttft_ms)


def test_the_runner_prints_and_writes_the_table_for_a_repeated_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    candidates = [
        Candidate("apc", lambda: FakeDriver("apc", 512, False)),
        Candidate("miniflex-cpu", lambda: FakeDriver("miniflex-cpu", 512, True)),
        Candidate("miniflex-cpu#2", lambda: Slow("miniflex-cpu#2", 512, True)),
    ]
    workload = OverflowWorkload(PromptMaker(1000), prompt_tokens=128, ratios=(2.0,))
    assert run_side_by_side([workload], candidates, Outputs(tmp_path), {}, print)
    payload = json.loads((tmp_path / "overflow" / "run.json").read_text())
    p50 = {r["config"]: r["ttft_p50_ms"] for r in payload["rows"]}  # rounded to 0.1 ms
    assert p50["miniflex-cpu#2"] > p50["miniflex-cpu"] < p50["apc"]
    got = {(r["config"], r["measure"]): r for r in payload["engines"]}
    apc, cpu = got[("apc", "ttft_p50_ms")], got[("miniflex-cpu", "ttft_p50_ms")]
    assert apc["engines"] == 1 and apc["vs_first"] == 1.0 and apc["ratio"] == 2.0
    assert cpu["engines"] == 2
    assert cpu["mean"] == pytest.approx((p50["miniflex-cpu"] + p50["miniflex-cpu#2"]) / 2)
    assert cpu["spread_x"] == pytest.approx(p50["miniflex-cpu#2"] / p50["miniflex-cpu"], abs=1e-3)
    assert cpu["vs_first"] == pytest.approx(p50["apc"] / cpu["mean"], abs=1e-3)
    assert "configurations on more than one engine" in capsys.readouterr().out
