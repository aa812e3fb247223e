"""The remote store's fetch speed, measured at a worker's start-up for the cost model.

Like the SSD read probe, so that the first remote hit is decided on a
measured bandwidth, not a guess: one chunk (a CPU slot's bytes) is put under
a probe key of this namespace, fetched back a few times into as many slots as
a load fetches at once (``remote_fetch_streams``; the pool is not in use yet at
start-up), and deleted. Real fetches refine
the figure afterwards. None when the store cannot be reached now.
"""

from __future__ import annotations

from miniflex.plan import RemoteCopy
from miniflex.remote.fetch import RemoteFetcher
from miniflex.types import ChunkKey, SlotId

__all__ = ["PROBE_KEY", "probe_fetch_bandwidth"]

PROBE_KEY = ChunkKey((1 << 128) - 1)
"""A key no chunk has in practice (keys are BLAKE2b digests)."""
_ROUNDS = 3


def probe_fetch_bandwidth(fetcher: RemoteFetcher) -> float | None:
    """Bytes/s of the loads' own fetch path (``fetcher``, its ``streams`` at once) into CPU
    slots of chunk-sized values (the best of a few rounds)."""
    pool, store = fetcher.pool, fetcher.store
    count = min(fetcher.streams, pool.num_slots)
    if not store.put(PROBE_KEY, memoryview(pool.slot(SlotId(0))).cast("B")):
        return None
    copies = [RemoteCopy(PROBE_KEY, SlotId(i)) for i in range(count)]
    best: float | None = None
    try:
        for _ in range(_ROUNDS):
            failed, seconds = fetcher.fetch(copies)
            if failed:
                return None
            best = seconds if best is None else min(best, seconds)
    finally:
        store.delete(PROBE_KEY)
    return count * pool.slot_bytes / best if best else None
