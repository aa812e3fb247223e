"""``bench/put_contention.py`` runs end to end on a small scale: every mode fetches every
chunk and puts every chunk, and the JSON has one row per mode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("redis")

from tests.remote.conftest import NEEDS_SERVER

pytestmark = NEEDS_SERVER

ROOT = Path(__file__).parents[2]


def test_put_contention_bench_reports_each_mode(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    args = ["--tokens", "1", "--count", "4", "--puts", "4", "--streams", "2", "--repeat", "1"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.put_contention", *args, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["alone", "beside puts", "loads first"]
    assert rows[0]["vs_alone"] == 1.0 and all(r["fetch_gbps"] > 0 for r in rows)
    assert rows[0]["puts_done_ms"] is None and all(r["puts_done_ms"] > 0 for r in rows[1:])
