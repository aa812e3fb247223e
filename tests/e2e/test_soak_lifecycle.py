"""``miniflex bench soak`` starts nothing on ``--dry-run``, and leaves nothing behind when it
is stopped while its servers start: no server process, no mounted disk, no directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ARGS = [
    *("--eager", "--block-size", "32", "--gpu-blocks", "32", "--max-num-batched-tokens", "256"),
    *("--soak-requests", "40", "--soak-rounds", "2", "--cpu-bytes", "8MiB"),
    *("--ssd-bytes", "16MiB", "--soak-disk-mib", "64"),
]


def soak_command(model: Path, out: Path, *more: str) -> list[str]:
    return [
        sys.executable,
        *("-m", "miniflex.tools.cli", "bench", "soak", "--model", str(model)),
        *ARGS,
        *("--out-dir", str(out), *more),
    ]


def soak_dirs() -> set[str]:
    return {p.name for p in Path("/var/tmp").glob("miniflex-soak-*")}


def soak_mounts() -> list[str]:
    return [
        line for line in Path("/proc/mounts").read_text().splitlines() if "miniflex-soak" in line
    ]


def marked_processes(mark: str) -> list[int]:
    """Live processes whose environment carries ``mark`` (the servers inherit it)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if mark.encode() in env and state != "Z":
            found.append(int(proc.name))
    return found


def test_dry_run_prints_the_plan_and_starts_nothing(tiny_model: Path, tmp_path: Path) -> None:
    before = soak_dirs()
    started = time.monotonic()
    proc = subprocess.run(
        soak_command(tiny_model, tmp_path, "--dry-run"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads(proc.stdout)
    assert (
        plan["requests"] == 40 and plan["rounds"] == 2 and "--enforce-eager" in plan["engine_args"]
    )
    assert time.monotonic() - started < 60
    assert soak_dirs() == before and not soak_mounts()
    assert not (tmp_path / "soak").exists()


def test_sigterm_while_servers_start_leaves_nothing_behind(
    tiny_model: Path, tmp_path: Path
) -> None:
    before = soak_dirs()
    mark = f"MINIFLEX_TEST_MARK_{uuid.uuid4().hex}"
    log = tmp_path / "soak.log"
    env = {**os.environ, "SOAK_LIFECYCLE_MARK": mark}
    with log.open("w") as f:
        proc = subprocess.Popen(
            soak_command(tiny_model, tmp_path), env=env, stdout=f, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 120
        while "starting vllm" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        assert soak_dirs() - before  # the soak made its directories...
        time.sleep(3)  # ...and its first server is starting
        assert marked_processes(mark), "no server started"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "interrupted during vllm" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    deadline = time.monotonic() + 10
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marked_processes(mark) == []
    assert soak_mounts() == []
    assert soak_dirs() == before
