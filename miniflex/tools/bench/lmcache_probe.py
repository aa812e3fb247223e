"""Whether LMCache can be a benchmark row here, asked of a child process.

Importing LMCache queries CUDA, which the benchmark process itself must not do
before vLLM starts its engine processes, so :func:`lmcache_unavailable` imports it
in a child and reads one JSON line back. LMCache must import with its vLLM
adapter, see the GPU, and move KV with its compiled CUDA kernels.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator

__all__ = ["environ", "lmcache_env", "lmcache_unavailable"]


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the block, then restore what was there."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def lmcache_env() -> dict[str, str]:
    """What LMCache reads only from the environment: no usage report over the network from a
    benchmark, and its log level at vLLM's (its per-request INFO lines cost time)."""
    return {
        "LMCACHE_TRACK_USAGE": "false",
        "LMCACHE_LOG_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper(),
    }


_LMCACHE_PROBE = """
import importlib, inspect, json
import lmcache
from lmcache.integration.vllm import vllm_v1_adapter  # what LMCacheConnectorV1 imports
native, error = None, None
try:
    from lmcache.v1.platform import resolve_device_ops
    ops = resolve_device_ops(lmcache.torch_device_type)
    native = inspect.isbuiltin(ops.multi_layer_kv_transfer)  # a compiled function, or torch's
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
if native is False:
    for name in ("lmcache.cuda_ops", "lmcache.c_ops"):  # 0.5.4 and later, 0.5.3 and before
        try:
            importlib.import_module(name)
        except ImportError as exc:
            error = str(exc)
            break
print(json.dumps({"version": lmcache.__version__, "device": lmcache.torch_device_type,
                  "native": native, "error": error}))
"""


@functools.cache
def lmcache_unavailable(timeout_s: float = 300.0) -> str | None:
    """Why the ``lmcache`` configuration cannot run on this CUDA machine (None: it can).

    LMCache must import with its vLLM adapter, see the GPU, and move KV with its compiled
    CUDA kernels: its torch fallback (used when they do not load, as LMCache 0.5.4 and later
    against torch 2.11) copies vLLM 0.26's packed K/V layout to the wrong slots.
    """
    try:
        with environ(lmcache_env()):
            proc = subprocess.run(
                [sys.executable, "-c", _LMCACHE_PROBE],
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
    except subprocess.TimeoutExpired:
        return f"left out: importing LMCache took more than {timeout_s:.0f} s"
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        errors = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        return "left out: LMCache is not importable here: " + (
            errors[-1].strip() if errors else f"exit status {proc.returncode}"
        )
    try:
        found = json.loads(lines[-1])
    except ValueError:
        return f"left out: LMCache's import check printed {lines[-1][:200]!r}"
    if found["device"] != "cuda":
        return f"left out: LMCache does not see a CUDA device (it found {found['device']!r})"
    if found["native"] is None:
        return (
            f"left out: cannot tell whether LMCache {found['version']}'s CUDA kernels are "
            f"bound: {found['error']}"
        )
    if not found["native"]:
        why = f": {found['error']}" if found["error"] else ""
        return (
            f"left out: LMCache {found['version']}'s CUDA kernels do not load with this "
            f"torch{why}; its torch fallback copies vLLM's packed K/V layout to the wrong "
            "slots (stage LMCache 0.5.3 with bench/stage_lmcache.sh)"
        )
    return None
