"""The copy bandwidth that bounds a tier hit: pinned host-to-device on CUDA, memcpy on CPU.

A hit from the CPU tier cannot be faster than moving the prompt's KV bytes
over this link, so the TTFT benchmark's physical floor is
``KV bytes / bandwidth + TTFT of a full vLLM prefix-cache hit``.

Measured in a child process (``python -m miniflex.tools.bench.bandwidth``), so the
benchmark process itself never creates a CUDA context or keeps GPU memory
that vLLM's engines would then miss.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

__all__ = ["kv_copy_ms", "measure", "measure_in_child"]


def kv_copy_ms(tokens: int, kv_bytes_per_token: int | None, gbps: float | None) -> float | None:
    """Milliseconds to copy ``tokens`` tokens of KV at ``gbps`` (None: either is unknown)."""
    if not kv_bytes_per_token or not gbps:
        return None
    return tokens * kv_bytes_per_token / (gbps * 1e6)


def _best_gbps(copy: Any, sync: Any, nbytes: int, repeats: int) -> float:
    copy()
    sync()  # first touch and lazy initialisation stay out of the timing
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        copy()
        sync()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def measure(nbytes: int | None = None, repeats: int = 5) -> dict[str, Any]:
    """``{"kind", "GBps", "bytes", "device"}`` for this machine (best of ``repeats``)."""
    import torch

    if torch.cuda.is_available():
        nbytes = nbytes or 1 << 30
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        src.fill_(1)
        gbps = _best_gbps(
            lambda: dst.copy_(src, non_blocking=True), torch.cuda.synchronize, nbytes, repeats
        )
        return {
            "kind": "pinned H2D",
            "GBps": round(gbps, 2),
            "bytes": nbytes,
            "device": torch.cuda.get_device_name(),
        }
    nbytes = nbytes or 256 << 20
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    gbps = _best_gbps(lambda: dst.copy_(src), lambda: None, nbytes, repeats)
    return {"kind": "memcpy", "GBps": round(gbps, 2), "bytes": nbytes, "device": "cpu"}


def measure_in_child(timeout_s: float = 180.0) -> dict[str, Any]:
    """:func:`measure` in a fresh Python process; ``{"error": ...}`` if that fails."""
    proc = subprocess.run(
        [sys.executable, "-m", "miniflex.tools.bench.bandwidth"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    return dict(json.loads(lines[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bytes", type=int, default=None, help="bytes per copy")
    print(json.dumps(measure(ap.parse_args().bytes)), flush=True)


if __name__ == "__main__":
    main()
