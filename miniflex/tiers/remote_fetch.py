"""CPU slots for chunks fetched from the remote store: the scheduler side of a remote hit.

The remote store is not indexed locally: a lookup asks it which chunks it holds
(:mod:`miniflex.remote.lookup`), and a load then gives each such chunk a fresh
CPU slot, pinned and invisible like a store in progress, which the worker fills
with ``get_into`` before its GPU copy. :meth:`TierStack.release` publishes the
slot if the fetch succeeded and frees it otherwise, like an SSD promotion.

Once the load holds as many CPU slots as the tier can spare
(:attr:`TierStack.max_load_chunks`), or none can be freed, the rest of its remote
chunks are *streamed* like SSD chunks: fetched into the workers' staging slots
(numbered after the CPU tier's, handed out in turn after the load's SSD streams) and
copied to the GPU from there, a window at a time, never entering the CPU tier. So a
remote hit is not capped by the CPU tier's size either.

Example::

    sources = acquire_for_load(stack, keys, fetch=True)   # the local run, then fetches
"""

from __future__ import annotations

from collections.abc import Sequence

from miniflex.tiers.stack import ChunkSource, TierStack
from miniflex.types import ChunkKey

__all__ = ["acquire_fetches", "acquire_for_load"]


def acquire_for_load(
    stack: TierStack, keys: Sequence[ChunkKey], fetch: bool, in_step: bool = False
) -> list[ChunkSource]:
    """Pin a load's ``keys``: the local run (:meth:`TierStack.acquire`; ``in_step``: a
    load inside a step, no staging slots), then, if ``fetch`` (a remote tier, and a load
    before the step), fresh CPU slots or staging slots for the rest."""
    sources = stack.acquire(keys, stream=not in_step)
    if fetch and len(sources) < len(keys):
        sources += acquire_fetches(stack, keys[len(sources) :], sources)
    return sources


def acquire_fetches(
    stack: TierStack, keys: Sequence[ChunkKey], local: Sequence[ChunkSource] = ()
) -> list[ChunkSource]:
    """Sources for ``keys`` (in prefix order) that the lookup found in the remote store,
    after the load's ``local`` run.

    A key the CPU tier holds meanwhile is pinned there instead (a CPU hit). A fetched
    chunk gets a fresh CPU slot while the load holds fewer than
    :attr:`TierStack.max_load_chunks` and one can be freed; after that it streams
    through a staging slot (where the workers have any). The run ends at a key another
    job is storing or promoting into the CPU tier (it cannot be placed twice) or where
    no slot of either kind is left: the caller reports the blocks after it unavailable,
    and vLLM recomputes them.
    """
    cpu = stack.cpu
    streamed = sum(s.streamed for s in local)
    held = len(local) - streamed  # CPU slots the load pins (its CPU chunks, promotions)
    out: list[ChunkSource] = []
    for key in keys:
        if key in cpu:
            pinned = cpu.prepare_load([key])
            if not pinned:
                break
            held += 1
            out.append(ChunkSource(key, pinned[0]))
            continue
        if cpu.is_storing(key):
            break
        if (landing := stack.read_slot(key, held, streamed)) is None:
            break
        slot, staged = landing
        held, streamed = held + (not staged), streamed + staged
        out.append(ChunkSource(key, slot, remote=True, streamed=staged))
    return out
