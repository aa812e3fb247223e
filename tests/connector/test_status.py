"""The status file and ``miniflex inspect``: what an operator sees of a live engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from miniflex.cli import main
from miniflex.errors import ConfigError
from miniflex.inspect import inspect_status, load_status
from tests.connector.harness import BLOCK, make_harness

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


def test_inspect_refuses_what_is_not_a_status_file(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ConfigError, match="status file"):
        load_status(other)
    assert main(["inspect", str(tmp_path / "missing.json")]) == 2
