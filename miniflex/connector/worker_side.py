"""The worker half's start and its binding to vLLM's KV tensors.

What the facade learns about the engine once, in its constructor, is one frozen
:class:`EngineFacts`; the worker half is a :class:`~miniflex.worker.step_driver.StepDriver`
over this rank's :class:`~miniflex.worker.handler.MiniFlexHandler`, opened here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from miniflex.config import MiniFlexConfig
from miniflex.connector import compat
from miniflex.errors import TransferError
from miniflex.keys import Namespace
from miniflex.layout import KVGeometry
from miniflex.ranks import RankSetup, TPPlacement
from miniflex.remote.tier import WorkerRemote
from miniflex.shared_pool import shared_pool_path
from miniflex.worker.handler import MiniFlexHandler
from miniflex.worker.step_driver import StepDriver

__all__ = ["EngineFacts", "open_worker", "register_kv_caches"]


@dataclass(frozen=True)
class EngineFacts:
    """The engine as both halves plan for it (read from vLLM's config once)."""

    geometry: KVGeometry
    placement: TPPlacement
    page_order: str
    """The page order the scheduler plans for ("LBHNC" for a latent cache)."""
    ns: Namespace
    num_slots: int
    """CPU slots per pool."""
    engine_id: str


def open_worker(config: MiniFlexConfig, facts: EngineFacts) -> StepDriver:
    """This rank's worker half; its remote store is checked before vLLM allocates."""
    rank = compat.tp_rank()
    writes = facts.placement.writes(rank)
    remote = WorkerRemote.open(config, facts.ns.shard(rank).digest) if writes else None
    return StepDriver(MiniFlexHandler(config, remote))


def register_kv_caches(
    step: StepDriver,
    config: MiniFlexConfig,
    facts: EngineFacts,
    kv_caches: Mapping[str, torch.Tensor],
) -> None:
    """Bind the worker to vLLM's KV tensors; TransferError where they are not what the
    scheduler planned for."""
    rank = compat.tp_rank()
    shared = facts.placement.shared_pool
    pool = shared_pool_path(facts.engine_id, config.cpu_pool_file) if shared else None
    setup = RankSetup(rank, facts.placement, facts.ns.shard(rank).digest, pool)
    geometry = facts.geometry
    layout = step.handler.register(
        kv_caches, facts.num_slots, geometry.blocks_per_chunk, setup, geometry.latent
    )
    if layout.geometry != geometry or layout.order != facts.page_order:
        raise TransferError(
            f"KV tensors ({layout.order}, {layout.geometry}) differ from what the scheduler "
            f"planned for ({facts.page_order}, {geometry})"
        )
