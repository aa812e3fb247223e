"""The README's main job: ``miniflex demo`` runs real vLLM twice and prints the table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.engine import expected_hit

pytestmark = pytest.mark.e2e


def test_demo_prints_ttft_and_per_tier_hits(tmp_path: Path) -> None:
    out_json = tmp_path / "demo.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "miniflex.tools.cli",
            "demo",
            "--prompt-tokens",
            "1024",
            "--json",
            str(out_json),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ssd_dir = proc.stderr.split("SSD tier in ", 1)[1].split()[0]
    assert not Path(ssd_dir).exists()  # its data file, as large as the SSD tier, is removed
    assert (
        "TTFT ms" in proc.stdout and "CPU-hit tok" in proc.stdout and "SSD-hit tok" in proc.stdout
    )
    assert "[demo" in proc.stderr  # progress lines
    result = json.loads(out_json.read_text())
    assert result["provenance"]["commit"] and result["prompt_tokens"] > 0
    rows = {(r["scenario"], r["engine"]): r for r in result["rows"]}
    evicted = "same prompt, GPU copy evicted"
    over = next(s for s, _ in rows if s.endswith("2nd pass"))
    assert rows[(evicted, "APC only")]["cpu_hit_tokens"] == 0
    assert rows[(evicted, "APC only")]["gpu_hit_tokens"] == 0
    hit = expected_hit(1024)  # 992: whole blocks before the last token
    assert rows[(evicted, "MiniFlex")]["cpu_hit_tokens"] == hit
    assert rows[(evicted, "MiniFlex")]["declined_tokens"] == 0  # CPU chunks always load
    assert rows[(over, "APC only")]["gpu_hit_tokens"] == 0
    mf = rows[(over, "MiniFlex")]
    # no chunk of the working set is lost: every prompt is held whole, in CPU or on SSD
    assert mf["held_tokens"] == 6 * 1024
    # every held token vLLM could take is loaded, unless the cost model chose to recompute
    # it (beside an in-step SSD read that takes longer): a failed or short load shows here
    assert mf["cpu_hit_tokens"] + mf["ssd_hit_tokens"] + mf["declined_tokens"] == 6 * hit
    assert mf["declined_tokens"] <= 6 * hit // 4
    # the CPU tier holds about two of the six prompts: the rest come from SSD
    assert mf["ssd_hit_tokens"] >= 3 * hit
