"""The remote store's fetch speed, measured at a worker's start-up for the cost model.

Like the SSD read probe, so that the first remote hit is decided on a
measured bandwidth, not a guess: one chunk (a CPU slot's bytes) is put under
a probe key of this namespace, fetched back a few times into as many slots as
a load fetches at once (``remote_fetch_streams``; the pool is not in use yet at
start-up), and deleted. Real fetches refine
the figure afterwards. None when the store cannot be reached now.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from miniflex.pool import HostPool
from miniflex.remote.base import RemoteStore
from miniflex.types import ChunkKey, SlotId

__all__ = ["PROBE_KEY", "probe_fetch_bandwidth"]

PROBE_KEY = ChunkKey((1 << 128) - 1)
"""A key no chunk has in practice (keys are BLAKE2b digests)."""
_ROUNDS = 3


def probe_fetch_bandwidth(store: RemoteStore, pool: HostPool, streams: int = 1) -> float | None:
    """Bytes/s of ``get_into`` of chunk-sized values into CPU slots, ``streams`` at once as a
    load's fetches run (the best of a few rounds)."""
    count = min(streams, pool.num_slots)
    slots = [memoryview(pool.slot(SlotId(i))).cast("B") for i in range(count)]
    if not store.put(PROBE_KEY, slots[0]):
        return None
    best: float | None = None
    try:
        with ThreadPoolExecutor(len(slots), thread_name_prefix="miniflex-probe") as threads:
            for _ in range(_ROUNDS):
                t0 = time.perf_counter()
                got = list(threads.map(lambda slot: store.get_into(PROBE_KEY, slot), slots))
                if any(n != len(slots[0]) for n in got):
                    return None
                seconds = time.perf_counter() - t0
                best = seconds if best is None else min(best, seconds)
    finally:
        store.delete(PROBE_KEY)
    return len(slots) * len(slots[0]) / best if best else None
