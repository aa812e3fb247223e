"""Scheduler-side set-up of the SSD tier: its size, and its index seeded from disk.

vLLM builds the workers' KV caches (and so opens each rank's SSD store, which
replays and repairs its journal) before it builds the scheduler, so by the time
the scheduler-side connector exists the journals on disk are the truth. They
are read here without being opened for writing; with TP > 1 only chunks that
every rank holds in the same slot are served.
"""

from __future__ import annotations

from miniflex.config import MiniFlexConfig
from miniflex.connector.manager import MiniFlexManager
from miniflex.keys import Namespace
from miniflex.layout import KVGeometry
from miniflex.ssd.store import rank_dirs, read_slots, slot_count

__all__ = ["num_slots", "seed"]


def num_slots(config: MiniFlexConfig, slot_bytes: int) -> int:
    """SSD slots per rank (0: no SSD tier), the same number each worker's store has."""
    if not config.ssd_dirs:
        return 0
    return slot_count(config.ssd_bytes, len(config.ssd_dirs), slot_bytes)


def seed(
    manager: MiniFlexManager, config: MiniFlexConfig, geometry: KVGeometry, ns: Namespace
) -> int:
    """Publish the chunks the SSD stores already hold; returns how many."""
    if manager.ssd is None:
        return 0
    common = None
    for rank in range(ns.tp_size):
        dirs = rank_dirs(config.ssd_dirs, rank)
        found = read_slots(dirs, config.ssd_bytes, geometry.slot_bytes, ns.digest)
        common = found if common is None else {k: s for k, s in common.items() if found.get(k) == s}
    return manager.ssd.seed(common or {})
