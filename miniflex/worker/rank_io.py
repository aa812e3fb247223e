"""What a worker rank opens when it binds to vLLM's KV tensors: the layout, the CPU pool
(with the staging slots of streamed reads after the CPU tier's), the SSD store, the
movers and the reader of a load's promotions.

:func:`open_rank_io` builds them in dependency order (the pool first: the SSD copier,
the remote fetcher and both movers are bound to it) and hands them to the
:class:`~miniflex.worker.handler.MiniFlexHandler` as one :class:`RankIO`::

    io = open_rank_io(config, kv_caches, num_slots, blocks_per_chunk, RankSetup())
    io.pool.slot_bytes == io.layout.geometry.slot_bytes   # True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from miniflex.config import MiniFlexConfig
from miniflex.gpu.base import KVMover
from miniflex.gpu.registry import make_mover
from miniflex.layout import KVLayout, layout_from_tensors
from miniflex.pool import HostPool, stream_slots
from miniflex.ranks import RankSetup
from miniflex.remote.tier import WorkerRemote
from miniflex.shared_pool import SharedPool
from miniflex.ssd.copier import SSDCopier
from miniflex.worker.promotions import Promoter

__all__ = ["RankIO", "open_rank_io"]


@dataclass(frozen=True)
class RankIO:
    """One rank's bytes and the means to move them; the handler owns and closes them."""

    layout: KVLayout
    pool: HostPool
    ssd: SSDCopier | None
    """This rank's SSD store (None: no ``ssd_dirs``, or a rank that writes nothing)."""
    mover: KVMover
    """Loads: the gpu-load lane's, and in-step loads on vLLM's thread."""
    store_mover: KVMover
    """Stores: the gpu-store lane's (``make_mover(..., stores_only=True)``)."""
    promoter: Promoter
    staging: int = 0
    """The pool's staging slots, after the CPU tier's (:func:`miniflex.pool.stream_slots`)."""


def _open_pool(
    config: MiniFlexConfig, slot_bytes: int, num_slots: int, setup: RankSetup
) -> HostPool:
    """This rank's pool, or the one all ranks of a replicated cache share."""
    if setup.shared_pool is not None:
        keep = bool(config.cpu_pool_file)
        ranks = setup.placement.tp_size
        return SharedPool(num_slots, slot_bytes, setup.shared_pool, ranks, keep_file=keep)
    pool_file = config.cpu_pool_file
    return HostPool(num_slots, slot_bytes, f"{pool_file}.{setup.rank}" if pool_file else None)


def open_rank_io(
    config: MiniFlexConfig,
    kv_caches: Mapping[str, torch.Tensor],
    num_slots: int,
    blocks_per_chunk: int,
    setup: RankSetup,
    latent: bool = False,
    remote: WorkerRemote | None = None,
) -> RankIO:
    """Bind to ``kv_caches`` (``latent``: an MLA cache) and open this rank's pool of
    ``num_slots``, its SSD store (when ``setup`` says it writes) and its movers;
    ``remote``: the rank's remote tier, whose fetches land in the pool. If any of it
    fails, what was opened is closed again before the error propagates."""
    layout = layout_from_tensors(kv_caches, blocks_per_chunk, latent)
    staging = stream_slots(config, layout.geometry.slot_bytes, setup.placement)
    pool = _open_pool(config, layout.geometry.slot_bytes, num_slots + staging, setup)
    ssd = None
    try:
        if config.ssd_dirs and setup.writes:
            assert setup.shard_digest is not None, "the SSD tier needs the namespace digest"
            ssd_bytes = setup.placement.per_store(config.ssd_bytes)
            ssd = SSDCopier(config, pool, setup.shard_digest, setup.rank, ssd_bytes)
        shared = pool if isinstance(pool, SharedPool) else None
        fetcher = remote.bind(pool) if remote is not None else None
        return RankIO(
            layout=layout,
            pool=pool,
            ssd=ssd,
            mover=make_mover(config, layout, kv_caches, pool),
            store_mover=make_mover(config, layout, kv_caches, pool, stores_only=True),
            promoter=Promoter(ssd, shared, setup.writes, fetcher),
            staging=staging,
        )
    except BaseException:  # what was opened is closed: the handler never saw it
        if ssd is not None:
            ssd.close()
        pool.close()
        raise
