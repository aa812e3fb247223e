"""Finished requests whose KV blocks vLLM keeps for MiniFlex, and for how long.

When a request ends while MiniFlex still moves its blocks (its last stores are running,
or their chunks wait for CPU slots on their way to SSD or to the remote store's
write-through), ``request_finished`` asks vLLM to keep the blocks, and vLLM hands them
out again only once a worker reports the request finished-sending (finished-receiving
for an aborted load). Until then they are KV space no other request can have: a long
prompt that needs them waits. :class:`HeldBlocks` times each such hold, from the finish
to the report, and the scheduler half adds the holds to its counters
(``blocks_held_requests``, ``blocks_held_seconds``). With several KV cache groups the
full-attention group's counters, the ones reported, hold a request whenever any group
kept its blocks (:mod:`miniflex.connector.hma_groups`). Example::

    held = HeldBlocks()
    held.hold("req-1")                       # request_finished returned True
    held.released({"req-1"})                 # (1, 0.42): one hold ended, after 0.42 s
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from miniflex.types import ReqId

__all__ = ["HeldBlocks"]


class HeldBlocks:
    """When each finished request whose blocks vLLM keeps for MiniFlex finished."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._since: dict[ReqId, float] = {}

    def hold(self, req_id: ReqId) -> None:
        """``req_id`` finished now, and vLLM keeps its blocks until MiniFlex releases them; a
        hold already started for it keeps its start (counted once)."""
        self._since.setdefault(req_id, self._clock())

    def released(self, req_ids: Iterable[ReqId]) -> tuple[int, float]:
        """vLLM got these requests' blocks back now: how many of them were held, and for how
        many seconds in all since each finished. Requests not held are ignored (a load of a
        running request reports finished-receiving too)."""
        now, n, seconds = self._clock(), 0, 0.0
        for r in req_ids:
            since = self._since.pop(r, None)
            if since is not None:
                n, seconds = n + 1, seconds + now - since
        return n, seconds

    def __len__(self) -> int:
        """Requests held now."""
        return len(self._since)
