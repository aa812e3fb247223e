"""The start-up probe: how fast this worker's mover loads, whole and layer by layer.

The cost model needs the CPU -> GPU bandwidth of both load paths before the
first hit, because it only learns a path's speed from loads that took it: a
model that starts out believing both are equally fast picks layerwise loads
for whole hits, where the layer-by-layer path can be the slower one, and
never tries the other. So each worker times one load of ``PROBE_CHUNKS``
chunks both ways when it registers, from pool slots into vLLM's KV cache.
That cache holds no request yet, so the bytes written there are never read.
With an SSD tier or a remote store, the rank also times a read of each
(:func:`probe_rank`), so the cost model starts from the speeds seen here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from miniflex.gpu.base import KVMover
from miniflex.layout import KVLayout
from miniflex.plan import ChunkMove, LoadProbe
from miniflex.types import BlockId, SlotId

if TYPE_CHECKING:
    from miniflex.remote.tier import WorkerRemote
    from miniflex.ssd.copier import SSDCopier

__all__ = ["PROBE_CHUNKS", "probe_loads", "probe_rank"]

logger = logging.getLogger(__name__)

PROBE_CHUNKS = 32
"""Chunks per timed load (fewer if the pool or vLLM's cache is smaller)."""


def probe_loads(mover: KVMover, layout: KVLayout, num_slots: int) -> LoadProbe | None:
    """Time ``load`` and ``load_layerwise`` of the same chunks (after a warm-up of each).

    Uses vLLM blocks from 1 on (block 0 is vLLM's null block). Returns None,
    logged, where the cache or pool is too small or the mover fails: the cost
    model then starts from its defaults.
    """
    bpc = layout.geometry.blocks_per_chunk
    n = min(PROBE_CHUNKS, num_slots, (layout.num_blocks - 1) // bpc)
    if n < 1:
        return None
    chunks = [
        ChunkMove(SlotId(i), tuple(BlockId(1 + i * bpc + j) for j in range(bpc))) for i in range(n)
    ]
    try:
        mover.load(chunks)
        mover.load_layerwise(chunks).wait()
        t0 = time.perf_counter()
        nbytes = mover.load(chunks)
        t1 = time.perf_counter()
        mover.load_layerwise(chunks).wait()
        t2 = time.perf_counter()
    except Exception as exc:  # a probe must never keep vLLM from starting
        logger.warning("MiniFlex load probe failed (%s); the cost model starts from defaults", exc)
        return None
    probe = LoadProbe(nbytes, t1 - t0, t2 - t1)
    logger.info(
        "MiniFlex load probe: %d chunks, %.1f GB/s whole, %.1f GB/s layer by layer",
        n,
        nbytes / probe.load_seconds / 1e9,
        nbytes / probe.layerwise_seconds / 1e9,
    )
    return probe


def probe_rank(
    mover: KVMover,
    layout: KVLayout,
    num_slots: int,
    ssd: SSDCopier | None,
    remote: WorkerRemote | None,
) -> LoadProbe | None:
    """One rank's start-up probe: its loads (:func:`probe_loads`), then the read speed of its
    SSD tier and the fetch speed of its remote store, where it has them."""
    probe = probe_loads(mover, layout, num_slots)
    if probe is not None and ssd is not None:
        probe = replace(probe, ssd_read_bps=ssd.probe_read())
    if probe is not None and remote is not None:
        probe = replace(probe, remote_read_bps=remote.probe())
    return probe
