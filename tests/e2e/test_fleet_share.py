"""``bench.fleet_share`` smoke: two live servers share a prompt through one store at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import NEEDS_REDIS

pytest.importorskip("redis", reason="the redis client is missing: pip install -e '.[remote]'")
pytestmark = [pytest.mark.e2e, *NEEDS_REDIS]


def test_the_second_replica_loads_the_first_ones_prompts_from_the_store(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    args = ["--prompts", "2", "--prompt-tokens", "512", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.fleet_share", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [r["b_remote_hit_tokens"] for r in result["rows"]] == [480, 480]  # all but a block
    assert result["summary"]["recompute_over_shared"] > 0
    assert "| speed-up |" in proc.stdout


def test_bad_arguments_end_before_anything_starts() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.fleet_share", "--prompts", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and "--prompts must be at least 2" in proc.stderr
