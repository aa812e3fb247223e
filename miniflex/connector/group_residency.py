"""Which chunks of a request each KV cache group of a hybrid model holds, for its hit.

A hybrid model's hit is the longest prefix for which every group holds what it needs
(:func:`miniflex.hybrid.longest_hit`). :func:`group_held` answers "does group ``g`` hold
chunk ``c``" from vLLM's own hit, the group's CPU and SSD tiers and the remote store. A
sliding-window group needs a window, not a prefix, so the store is asked about each chunk
(``RemoteLookup.held_each``), not about a leading run; and it is asked at all only where
the full-attention ("main") group decided to load past what it holds locally, so that a
lookup with nothing remote to load costs no round trip. Scheduler side.

Example::

    held = group_held(managers, main=1, req_id="r", local_chunks=0, decided_end=15)
    longest_hit(needs, held, num_keys, num_tokens - 1, chunk_tokens, block_size)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from miniflex.types import ChunkKey

__all__ = ["group_held"]


def group_held(
    managers: Sequence[Any], main: int, req_id: str, local_chunks: int, decided_end: int
) -> Callable[[int, int], bool]:
    """``held(g, c)`` over each group's manager (``managers[g]``). ``local_chunks``: the
    chunks vLLM's own hit covers; ``decided_end``: the chunk after the last one the main
    group decided to load. The store is asked here, once per group, if at all."""
    keys = [m.state_for(req_id).keys for m in managers]

    def local(g: int, c: int) -> bool:
        m, k = managers[g], keys[g]
        return c < len(k) and (k[c] in m.cpu or (m.ssd is not None and k[c] in m.ssd))

    chunks = range(local_chunks, decided_end)
    needs_store = any(not local(main, c) for c in chunks)
    remote = [
        _remote_held(m, keys[g], [c for c in chunks if not local(g, c)]) if needs_store else set()
        for g, m in enumerate(managers)
    ]

    def held(g: int, c: int) -> bool:
        return c < local_chunks or local(g, c) or c in remote[g]

    return held


def _remote_held(manager: Any, keys: Sequence[ChunkKey], chunks: list[int]) -> set[int]:
    """Those of ``chunks`` the group's remote store holds (none without a remote tier)."""
    if manager.remote is None:
        return set()
    ask = [c for c in chunks if c < len(keys)]
    found = manager.remote.held_each([keys[c] for c in ask])
    return {c for c, f in zip(ask, found, strict=True) if f}
