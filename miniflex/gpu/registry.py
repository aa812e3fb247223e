"""The registry of movers: the one place that maps ``config.mover`` to a KVMover.

* ``cpu``: :class:`~miniflex.gpu.cpu_mover.TorchMover`, on any device;
* ``kernel``: :class:`~miniflex.gpu.kernel_mover.KernelMover` (CUDA + CuPy);
* ``dma``: :class:`~miniflex.gpu.dma_mover.DMAMover` (CUDA + cuda-bindings);
* ``staged``: :class:`~miniflex.gpu.staged_mover.StagedMover` (CUDA + CuPy);
* ``auto``: the tuning cache's winner for this GPU, layout and chunk size
  (``miniflex tune`` writes it), else ``staged`` where the KV cache is on
  CUDA and CuPy is installed, else ``cpu``; ``kernel`` instead of ``staged`` when
  the staging buffer does not fit beside vLLM's KV cache (``headroom.py``).

The CUDA movers are imported only when chosen, so nothing here loads CuPy or
``cuda.bindings`` on a machine without them.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping

import torch

from miniflex.config import MiniFlexConfig, default_tune_cache
from miniflex.errors import ConfigError
from miniflex.gpu.base import KVMover
from miniflex.gpu.cpu_mover import TorchMover
from miniflex.gpu.headroom import device_room, staging_bytes, staging_problem
from miniflex.gpu.tune_cache import TuneChoice, lookup, tune_key
from miniflex.layout import KVLayout
from miniflex.pool import HostPool

__all__ = ["MOVERS", "cuda_mover_problem", "make_mover"]

logger = logging.getLogger("miniflex.gpu")

MOVERS = ("auto", "cpu", "kernel", "dma", "staged")
_NEEDS = {
    "kernel": ("cupy", "CuPy (pip install cupy-cuda13x, or cupy-cuda12x on CUDA 12)"),
    "dma": ("cuda.bindings", "cuda-bindings (pip install cuda-bindings)"),
    "staged": ("cupy", "CuPy (pip install cupy-cuda13x, or cupy-cuda12x on CUDA 12)"),
}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a missing parent package ("cuda")
        return False


def cuda_mover_problem(name: str, on_cuda: bool) -> str | None:
    """Why the CUDA mover ``name`` can't run here (a sentence), or None if it can."""
    if not on_cuda:
        return (
            "the KV cache is in host memory (vLLM's CPU backend), where only the 'cpu' "
            "mover applies"
        )
    module, package = _NEEDS[name]
    if not _importable(module):
        return f"the {name} mover needs {package}, which is not installed"
    return None


def make_mover(
    config: MiniFlexConfig,
    layout: KVLayout,
    kv_caches: Mapping[str, torch.Tensor],
    pool: HostPool,
    stores_only: bool = False,
) -> KVMover:
    """Build the configured mover; ``auto`` picks the best one for where the KV cache lives.

    ``stores_only``: the mover will only store. The staged mover with direct stores
    stores exactly as the kernel mover does, so that is built instead, without the
    staging buffer it would never use."""
    name = config.mover
    if name not in MOVERS:
        raise ConfigError("mover", name, "expected one of " + ", ".join(MOVERS))
    on_cuda = all(t.is_cuda for t in kv_caches.values())
    wants_tuning = name == "auto" or (name == "kernel" and not config.kernel_ctas)
    tuned = _tuned(config, layout, kv_caches) if on_cuda and wants_tuning else None
    if name == "auto":
        name = tuned.mover if tuned else "staged" if on_cuda else "cpu"
        problem = cuda_mover_problem(name, on_cuda) if name != "cpu" else None
        if problem:
            logger.warning("MiniFlex mover 'auto': %s; using the 'cpu' mover", problem)
            name = "cpu"
        logger.info("MiniFlex mover 'auto' chose %r%s", name, " (tuned)" if tuned else "")
    if name == "cpu":
        return TorchMover(layout, kv_caches, pool)
    problem = cuda_mover_problem(name, on_cuda)
    if problem:
        raise ConfigError("mover", config.mover, problem)
    direct_stores = config.staging_stores == "direct"
    if name == "staged" and stores_only and direct_stores:
        name, tuned = "kernel", None  # the staged mover's direct path, nothing tuned
    elif name == "staged" and not _staging_fits(config, pool, kv_caches):
        name, tuned = "kernel", None  # mover=auto: the kernel mover needs no staging
    if name == "kernel":
        from miniflex.gpu.kernel_mover import KernelMover

        ctas = config.kernel_ctas or (tuned.ctas if tuned else None)
        return KernelMover(layout, kv_caches, pool, ctas=ctas, vec=tuned.vec if tuned else None)
    if name == "staged":
        from miniflex.gpu.staged_mover import StagedMover

        return StagedMover(
            layout,
            kv_caches,
            pool,
            ctas=config.kernel_ctas or None,
            lane_bytes=config.staging_lane_bytes,
            direct_stores=direct_stores,
        )
    from miniflex.gpu.dma_mover import DMAMover

    return DMAMover(layout, kv_caches, pool)


def _staging_fits(
    config: MiniFlexConfig, pool: HostPool, kv_caches: Mapping[str, torch.Tensor]
) -> bool:
    """Whether the staged mover's buffer fits beside vLLM's KV cache (``headroom.py``).
    With mover=auto, False after a warning (the kernel mover is built instead); with
    mover=staged, a ConfigError that says how to make room."""
    from miniflex.gpu.staged_mover import LANES

    device = next(iter(kv_caches.values())).device
    needed = staging_bytes(pool.slot_bytes, config.staging_lane_bytes, LANES)
    problem = staging_problem(needed, device_room(device))
    if problem is None:
        return True
    if config.mover != "auto":
        raise ConfigError("mover", config.mover, problem)
    logger.warning(
        "MiniFlex mover 'auto': the staged mover does not fit: %s; using 'kernel'", problem
    )
    return False


def _tuned(
    config: MiniFlexConfig, layout: KVLayout, kv_caches: Mapping[str, torch.Tensor]
) -> TuneChoice | None:
    device = next(iter(kv_caches.values())).device
    key = tune_key(torch.cuda.get_device_name(device), layout)
    return lookup(config.tune_cache or default_tune_cache(), key)
