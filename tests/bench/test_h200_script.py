"""``bench/run_h200.sh``: every part's arguments pass the benchmark's own checks.

The script runs only on the GPU machine; here each part runs with ``--dry-run``,
which parses and validates the arguments, sizes the tiers and prints the engine
settings instead of starting engines. The checks are what every part must keep,
whatever its sizes: it runs, it compares against APC, and it runs vLLM as users
do (CUDA graphs, not eager).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from miniflex.config import parse_size

ROOT = Path(__file__).parents[2]
PARTS = ("ttft", "decode", "burst", "overflow", "mixed", "overhead", "multiturn", "ssd", "mla")


def h200_dry_run(
    part: str, out: Path, extra: str = "", run: str = "", env: dict[str, str] | None = None
) -> dict[str, Any]:
    """``bench/run_h200.sh PART`` with ``--dry-run`` (and ``extra`` arguments, ``env``
    variables): the engine settings it would use (those of its run ``run`` where it has
    several)."""
    proc = subprocess.run(
        ["bash", str(ROOT / "bench" / "run_h200.sh"), part, str(out)],
        env={
            **os.environ,
            "PYTHON": sys.executable,
            "EXTRA_ARGS": f"--dry-run {extra}",
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads((out / f"{run or part}.txt").read_text())


@pytest.mark.parametrize("part", PARTS)
def test_each_part_of_the_h200_script_passes_the_benchmark_checks(
    part: str, tmp_path: Path
) -> None:
    plan = h200_dry_run(part, tmp_path)
    assert "apc" in plan["kv_transfer"]
    assert any(name.startswith("miniflex") for name in plan["kv_transfer"])
    assert plan["llm_args"]["enforce_eager"] is False  # CUDA graphs, as users run vLLM


def test_h200_remote_part_passes_its_checks(tmp_path: Path) -> None:
    """The remote part's engines as the H200 runs them: a 30k-token prompt fits vLLM's
    cache and MiniFlex's CPU tier; with CUDA graphs; no engine or store started here."""
    plan = h200_dry_run("remote", tmp_path)
    assert plan["settings"]["prompt_tokens"] == "8192,30000"
    engine = plan["engine"]
    assert engine["gpu_blocks"] * engine["block_size"] >= 30000 + 16
    assert engine["load_format"] == "dummy" and engine["eager"] is False
    assert parse_size("cpu_bytes", plan["settings"]["cpu_bytes"]) >= 30000 * 147456


def test_result_files_name_the_card_that_measured_them(tmp_path: Path) -> None:
    """A figure names its card: CARD (else nvidia-smi's name of it) is in every result
    file's name, so an H100's run is never filed as an H200's."""
    plan = h200_dry_run("remote", tmp_path / "a", env={"CARD": "h100"})
    assert plan["settings"]["json"] == str(tmp_path / "a" / "remote" / "h100.json")
    for name, card in (("NVIDIA H200", "h200"), ("", "gpu")):  # "": nvidia-smi names none
        smi = tmp_path / card / "bin" / "nvidia-smi"
        smi.parent.mkdir(parents=True)
        smi.write_text(f"#!/bin/sh\necho '{name}'\n")
        smi.chmod(0o755)
        path = f"{smi.parent}:{os.environ['PATH']}"
        plan = h200_dry_run("remote", tmp_path / card, env={"PATH": path, "CARD": ""})
        assert plan["settings"]["json"] == str(tmp_path / card / "remote" / f"{card}.json")


def test_h200_regime_part_keeps_long_prompts_on_disk_only(tmp_path: Path) -> None:
    """The regime part, one run per model shape: the longest prompt fits vLLM's cache and
    the model, its remainder computes in one step, and the SSD tier still holds it after
    the fillers (1.5x the CPU tier) have pushed it out of the CPU tier."""
    h200_dry_run("regime", tmp_path, run="regime-32b")  # both shapes run
    for run, longest, kv_per_token in (
        ("regime-32b", 32768, 262144),
        ("regime-8b-128k", 131072, 147456),
    ):
        plan = json.loads((tmp_path / f"{run}.txt").read_text())
        llm = plan["llm_args"]
        assert llm["enforce_eager"] is False and llm["load_format"] == "dummy"
        assert llm["max_model_len"] >= longest and llm["max_num_batched_tokens"] >= longest // 2
        assert llm["kv_cache_memory_bytes"] >= (longest + 16) * kv_per_token
        assert plan["kv_transfer"]["apc"] is None
        for name in ("miniflex-ssd", "miniflex-ssd+hit_policy=load+load_mode=async"):
            extra = plan["kv_transfer"][name]["kv_connector_extra_config"]
            fillers = 3 * extra["cpu_bytes"] // 2
            assert extra["ssd_bytes"] >= longest * kv_per_token + fillers


def test_ssd_cpu_bytes_cpu_gives_cpu_ssd_the_cpu_tiers_bytes(tmp_path: Path) -> None:
    """``--ssd-cpu-bytes cpu``: CPU+SSD against the CPU tier alone, byte for byte (by
    default miniflex-ssd's CPU tier is smaller, so that its SSD tier is read)."""

    def cpu_bytes(plan: dict[str, Any], config: str) -> int:
        extra = plan["kv_transfer"][config]["kv_connector_extra_config"]
        return parse_size("cpu_bytes", str(extra["cpu_bytes"]))

    default = h200_dry_run("overflow", tmp_path / "default")
    assert cpu_bytes(default, "miniflex-ssd") < cpu_bytes(default, "miniflex-cpu")
    same = h200_dry_run("overflow", tmp_path / "same", "--ssd-cpu-bytes cpu")
    assert cpu_bytes(same, "miniflex-ssd") == cpu_bytes(same, "miniflex-cpu")
    assert cpu_bytes(same, "miniflex-cpu") == cpu_bytes(default, "miniflex-cpu")
