"""Scheduler-side set-up of the SSD tier: its size, and its index seeded from disk.

vLLM builds the workers' KV caches (and so opens each rank's SSD store, which
replays and repairs its journal) before it builds the scheduler, so by the time
the scheduler-side connector exists the journals on disk are the truth. They
are read here without being opened for writing; with TP > 1 only chunks that
every rank holds in the same slot are served (one plan drives all ranks, so a
chunk one rank lacks, or holds elsewhere, would be a hit the ranks disagree
on). What one rank alone recovered stays in its journal until the slot is
reused.
"""

from __future__ import annotations

from miniflex.config import MiniFlexConfig
from miniflex.keys import Namespace
from miniflex.layout import KVGeometry
from miniflex.ranks import TPPlacement
from miniflex.scheduler.manager import MiniFlexManager
from miniflex.ssd.store import rank_dirs, read_slots, slot_count

__all__ = ["num_slots", "seed"]


def num_slots(config: MiniFlexConfig, slot_bytes: int, placement: TPPlacement) -> int:
    """SSD slots per store (0: no SSD tier), the same number each worker's store has."""
    if not config.ssd_dirs:
        return 0
    return slot_count(placement.per_store(config.ssd_bytes), len(config.ssd_dirs), slot_bytes)


def seed(
    manager: MiniFlexManager,
    config: MiniFlexConfig,
    geometry: KVGeometry,
    ns: Namespace,
    placement: TPPlacement,
) -> int:
    """Publish the chunks that every rank's SSD store holds in the same slot; returns how many."""
    if manager.ssd is None:
        return 0
    found = [
        read_slots(
            rank_dirs(config.ssd_dirs, rank),
            placement.per_store(config.ssd_bytes),
            geometry.slot_bytes,
            ns.shard(rank).digest,
        )
        for rank in placement.store_ranks()
    ]
    common = {k: s for k, s in found[0].items() if all(f.get(k) == s for f in found[1:])}
    return manager.ssd.seed(common)
