"""CPU slots for chunks fetched from the remote store: the scheduler side of a remote hit.

The remote store is not indexed locally: a lookup asks it which chunks it holds
(:mod:`miniflex.remote.lookup`), and a load then gives each such chunk a fresh
CPU slot, pinned and invisible like a store in progress, which the worker fills
with ``get_into`` before its GPU copy. :meth:`TierStack.release` publishes the
slot if the fetch succeeded and frees it otherwise, like an SSD promotion.

Example::

    sources = acquire_for_load(stack, keys, fetch=True)   # the local run, then fetches
"""

from __future__ import annotations

from collections.abc import Sequence

from miniflex.tiers.slot_tier import SlotTier
from miniflex.tiers.stack import ChunkSource, TierStack
from miniflex.types import ChunkKey

__all__ = ["acquire_fetches", "acquire_for_load"]


def acquire_for_load(
    stack: TierStack, keys: Sequence[ChunkKey], fetch: bool, in_step: bool = False
) -> list[ChunkSource]:
    """Pin a load's ``keys``: the local run (:meth:`TierStack.acquire`; ``in_step``: a
    load inside a step, no staging slots), then, if ``fetch`` (a remote tier, and a load
    before the step), fresh CPU slots for the rest."""
    sources = stack.acquire(keys, stream=not in_step)
    if fetch and len(sources) < len(keys):
        sources += acquire_fetches(stack.cpu, keys[len(sources) :])
    return sources


def acquire_fetches(cpu: SlotTier, keys: Sequence[ChunkKey]) -> list[ChunkSource]:
    """Sources for ``keys`` (in prefix order) that the lookup found in the remote store.

    A key the CPU tier holds meanwhile is pinned there instead (a CPU hit). The
    run ends at a key another job is storing or promoting into the CPU tier (it
    cannot be placed twice) or when no CPU slot can be freed (all pinned): the
    caller reports the blocks after it unavailable, and vLLM recomputes them.
    """
    out: list[ChunkSource] = []
    for key in keys:
        if key in cpu:
            pinned = cpu.prepare_load([key])
            if not pinned:
                break
            out.append(ChunkSource(key, pinned[0]))
            continue
        if cpu.is_storing(key):
            break
        placed = cpu.prepare_store([key])
        if not placed:
            break
        out.append(ChunkSource(key, placed[0][1], remote=True))
    return out
