"""A load's remote fetches handed to its GPU copy in groups, as they arrive.

A LOAD that reads nothing from SSD fetches its remote chunks into CPU slots on the
remote-fetch lane (:mod:`miniflex.worker.load_reads`). Waiting for the last fetch
before the first GPU copy would add the whole copy to the load's time; instead, the
store tells of each chunk as soon as it is in its slot, verified
(``RemoteStore.get_many_into``'s ``done``), and :class:`Handoff` sends every
``group`` chunks that arrived to the gpu-load lane as one copy, so that the copies
run while later chunks are still arriving. Chunks whose fetch failed go with the next
group as unavailable blocks (load errors: vLLM recomputes them).

The fetch threads call :meth:`Handoff.arrived`; the lane that runs the fetch calls
:meth:`Handoff.flush` once it returns (the chunks no one told of are settled by its
failed keys: a rank that awaited another's fetches), or :meth:`Handoff.close` if it
raised, which stops any later hand-off and returns what was never sent. Example::

    handoff = Handoff(job.chunks, job.remote, group=4, send=queue_copy)
    failed, _, seconds = promoter.promote(job.job_id, (), job.remote, handoff.arrived)
    handoff.flush(failed)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from miniflex.plan import ChunkMove, RemoteCopy
from miniflex.types import BlockId, ChunkKey, SlotId

__all__ = ["HANDOFF_PARTS", "Handoff"]

HANDOFF_PARTS = 8
"""A load's fetched chunks go to the GPU in about this many copies (fewer for short loads):
only the last one's copy is left once the last chunk has arrived."""

Send = Callable[[tuple[ChunkMove, ...], tuple[BlockId, ...]], None]
"""Queues one copy: the moves of chunks that arrived, the blocks of those that failed."""


class Handoff:
    """The fetched chunks of one load on their way to its GPU copy (see the module)."""

    def __init__(
        self,
        moves: Sequence[ChunkMove],
        fetches: Sequence[RemoteCopy],
        send: Send,
        group: int | None = None,
    ) -> None:
        """``moves``: the load's moves into vLLM's blocks; ``fetches``: its fetches into CPU
        slots, each the source of the move from its slot; ``group``: chunks per copy (None:
        about :data:`HANDOFF_PARTS` copies)."""
        by_slot = {m.slot: m for m in moves}
        self._moves: dict[SlotId, ChunkMove] = {c.cpu: by_slot[c.cpu] for c in fetches}
        self._keys: dict[SlotId, ChunkKey] = {c.cpu: c.key for c in fetches}
        self._send = send
        self._group = group or max(1, -(-len(fetches) // HANDOFF_PARTS))
        self._lock = threading.Lock()
        self._seen: set[SlotId] = set()  # told of (or settled)
        self._sent: set[SlotId] = set()  # handed to ``send``
        self._ready: list[SlotId] = []  # arrived, not sent yet
        self._lost: list[SlotId] = []  # failed, not sent yet
        self._closed = False

    def arrived(self, copy: RemoteCopy, ok: bool) -> None:
        """A fetch ended (``ok``: its slot holds the chunk); a fetch thread. Never raises."""
        with self._lock:
            if self._closed or copy.cpu in self._seen or copy.cpu not in self._moves:
                return
            self._note(copy.cpu, ok)
            if len(self._ready) < self._group:
                return
            part = self._take()
        self._send(*part)

    def flush(self, failed: set[ChunkKey]) -> None:
        """The fetch returned: settle the chunks no one told of (``failed`` keys lost, the
        others arrived), then send what is left."""
        with self._lock:
            for slot in self._moves.keys() - self._seen:
                self._note(slot, self._keys[slot] not in failed)
            self._closed = True
            part = self._take()
        if part[0] or part[1]:
            self._send(*part)

    def close(self) -> tuple[ChunkMove, ...]:
        """The fetch raised: no hand-off after this one; returns the moves never sent."""
        with self._lock:
            self._closed = True
            return tuple(m for slot, m in self._moves.items() if slot not in self._sent)

    def _note(self, slot: SlotId, ok: bool) -> None:
        self._seen.add(slot)
        (self._ready if ok else self._lost).append(slot)

    def _take(self) -> tuple[tuple[ChunkMove, ...], tuple[BlockId, ...]]:
        moves = tuple(self._moves[s] for s in self._ready)
        lost = tuple(b for s in self._lost for b in self._moves[s].block_ids)
        self._sent.update(self._ready, self._lost)
        self._ready, self._lost = [], []
        return moves, lost
