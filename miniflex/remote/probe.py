"""The remote store's fetch speed, measured at a worker's start-up for the cost model.

Like the SSD read probe, so that the first remote hit is decided on a
measured bandwidth, not a guess: one chunk (a CPU slot's bytes) is put under
a probe key of this namespace, fetched back into the same slot a few times
(the same bytes, so the slot is unchanged), and deleted. Real fetches refine
the figure afterwards. None when the store cannot be reached now.
"""

from __future__ import annotations

import time

from miniflex.pool import HostPool
from miniflex.remote.base import RemoteStore
from miniflex.types import ChunkKey, SlotId

__all__ = ["PROBE_KEY", "probe_fetch_bandwidth"]

PROBE_KEY = ChunkKey((1 << 128) - 1)
"""A key no chunk has in practice (keys are BLAKE2b digests)."""
_ROUNDS = 3


def probe_fetch_bandwidth(store: RemoteStore, pool: HostPool) -> float | None:
    """Bytes/s of ``get_into`` of one chunk-sized value into a CPU slot (the best of a few)."""
    slot = memoryview(pool.slot(SlotId(0))).cast("B")
    if not store.put(PROBE_KEY, slot):
        return None
    best: float | None = None
    try:
        for _ in range(_ROUNDS):
            t0 = time.perf_counter()
            if store.get_into(PROBE_KEY, slot) != len(slot):
                return None
            seconds = time.perf_counter() - t0
            best = seconds if best is None else min(best, seconds)
    finally:
        store.delete(PROBE_KEY)
    return len(slot) / best if best else None
