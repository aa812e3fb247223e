"""The registry of movers: the one place that maps ``config.mover`` to a KVMover."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from miniflex.config import MiniFlexConfig
from miniflex.errors import ConfigError
from miniflex.gpu.base import KVMover
from miniflex.gpu.cpu_mover import TorchMover
from miniflex.layout import KVLayout
from miniflex.pool import HostPool

__all__ = ["MOVERS", "make_mover"]

MOVERS = ("auto", "cpu")


def make_mover(
    config: MiniFlexConfig,
    layout: KVLayout,
    kv_caches: Mapping[str, torch.Tensor],
    pool: HostPool,
) -> KVMover:
    """Build the configured mover; ``auto`` picks the best one for where the KV cache lives."""
    name = config.mover
    if name in ("auto", "cpu"):
        return TorchMover(layout, kv_caches, pool)
    raise ConfigError("mover", name, "expected one of " + ", ".join(MOVERS))
