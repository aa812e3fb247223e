"""Scheduler-side bookkeeping of one tier: which chunk key sits in which slot.

The scheduler owns this metadata and never the bytes. All asynchronous work is
two-phase, so that a slot is never reused or published while bytes are moving:

* ``prepare_load(keys)`` pins the chunks' slots; ``complete_load(slots, ok)``
  unpins them (and drops them if ``ok`` is False: a corrupt or unreadable
  chunk is never served twice).
* ``prepare_store(keys)`` allocates slots (evicting unpinned chunks) and pins
  them; the chunks stay invisible to lookups until ``complete_store(.., ok=True)``
  publishes them. ``ok=False`` frees the slots again.

Example::

    tier = SlotTier(Tier.CPU, num_slots=2)
    placed = tier.prepare_store([k1, k2])   # [(k1, 0), (k2, 1)], pinned, not visible
    tier.complete_store(placed, ok=True)    # now tier.match([k1, k2]) == 2
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from miniflex.index import HashIndex, compile_kernels, keys_to_array, make_policy
from miniflex.types import ChunkKey, SlotId, Tier

__all__ = ["Keeper", "SlotTier", "TierUsage"]


@dataclass(frozen=True)
class TierUsage:
    tier: Tier
    num_slots: int
    resident: int
    pinned_or_moving: int
    free: int
    evictions: int


class Keeper(Protocol):
    """Whoever writes a tier's evicted chunks to another tier (the hierarchy's write-back,
    :class:`~miniflex.tiers.writeback.WriteBack`), asked while a call makes room. It is
    passed to each call that may evict (:meth:`SlotTier.prepare_store`,
    :meth:`SlotTier.evict_one`); the tier holds no reference to it."""

    def keep(self, key: ChunkKey, slot: SlotId) -> bool:
        """Making room evicts ``key`` from ``slot``. False: the slot goes to its new owner at
        once. True: the chunk is being written to another tier; it stays resident and
        readable, pinned, until :meth:`SlotTier.finish_eviction`, and making room goes on
        with the next victim."""
        ...

    def reclaim(self, tier: SlotTier, force: bool) -> bool:
        """No slot of ``tier`` is free: free the slot of a kept chunk
        (:meth:`SlotTier.release_kept`) and say True, or False to evict as usual. Asked
        before each victim; when nothing is left to evict, asked again with ``force`` True:
        a kept chunk's slot is then the only way not to lose the chunk being placed."""
        ...


class SlotTier:
    """Slot allocator + index + eviction policy for one tier (CPU pool or SSD file)."""

    def __init__(self, tier: Tier, num_slots: int, policy: str = "lru") -> None:
        assert num_slots > 0, "a tier needs at least one slot"
        self.tier = tier
        self.num_slots = num_slots
        compile_kernels()  # once per process: no serving step compiles one later
        self._index = HashIndex(max_entries=num_slots)
        self._policy = make_policy(policy, num_slots)
        self._free: list[SlotId] = [SlotId(s) for s in range(num_slots - 1, -1, -1)]
        self._slot_key: list[ChunkKey | None] = [None] * num_slots
        self._storing: dict[ChunkKey, tuple[SlotId, int]] = {}  # key -> (slot, generation)
        self._generation = 0  # bumped by clear(): stores started before it never publish
        self._doomed: set[SlotId] = set()  # dropped while pinned; freed at last unpin
        self.evictions = 0
        self.watch: Callable[[bool, ChunkKey], None] | None = None
        """Told of every chunk that becomes visible (True) or stops being visible (False)
        in this tier, as it happens (:mod:`miniflex.scheduler.chunk_events`); None: nobody."""

    # ---- lookups (side-effect free) ----
    def match(self, keys: Sequence[ChunkKey] | np.ndarray) -> int:
        """Number of leading ``keys`` resident and readable in this tier (one compiled call)."""
        arr = keys if isinstance(keys, np.ndarray) else keys_to_array(keys)
        return self._index.prefix_match(arr)

    def slot_of(self, key: ChunkKey) -> SlotId | None:
        hit = self._index.lookup(key)
        return None if hit is None else hit[1]

    def is_storing(self, key: ChunkKey) -> bool:
        return key in self._storing

    def __contains__(self, key: ChunkKey) -> bool:
        return key in self._index

    def __len__(self) -> int:
        return len(self._index)

    # ---- loads ----
    def prepare_load(self, keys: Sequence[ChunkKey]) -> list[SlotId]:
        """Pin and return the slots of the leading resident ``keys`` (may be shorter)."""
        slots: list[SlotId] = []
        for key in keys:
            slot = self.slot_of(key)
            if slot is None:
                break
            self._policy.pin(slot)
            slots.append(slot)
        return slots

    def complete_load(self, slots: Sequence[SlotId], ok: bool) -> None:
        """Unpin after a load; ``ok=False`` drops the chunks (never served again). ``slots``
        in prefix order: the first becomes the most recently used (see :meth:`touch`)."""
        for slot in reversed(slots):
            if not ok:
                self._unpublish(slot)
            self._unpin(slot)

    # ---- stores ----
    def prepare_store(
        self, keys: Sequence[ChunkKey], cold_from: int | None = None, keeper: Keeper | None = None
    ) -> list[tuple[ChunkKey, SlotId]]:
        """Allocate and pin slots for the ``keys`` not already resident or being stored.

        Resident keys are touched first so that making room never evicts the
        prefix being extended. Stops early (returns fewer placements) when no
        slot can be freed because everything left is pinned. ``keys[cold_from:]``
        (generated tokens, which few later prompts repeat) are placed at the cold
        end of the eviction order (:meth:`EvictionPolicy.touch_cold`): they stay
        while there is room and are the first to go, so they never push out a
        prompt another request may hit. A later hit warms them like any chunk. ``keeper``
        decides what happens to each chunk evicted for room (None: it is dropped).
        """
        cold = len(keys) if cold_from is None else max(0, cold_from)
        self.touch(keys[:cold])
        placed: list[tuple[ChunkKey, SlotId]] = []
        for i, key in enumerate(keys):
            if key in self._index or key in self._storing:
                continue
            slot = self._allocate(keeper)
            if slot is None:
                break
            self._storing[key] = (slot, self._generation)
            self._slot_key[slot] = key
            if i < cold:
                self._policy.touch(slot)
            else:
                self._policy.touch_cold(slot)
            self._policy.pin(slot)
            placed.append((key, slot))
        return placed

    def complete_store(self, placed: Sequence[tuple[ChunkKey, SlotId]], ok: bool) -> None:
        """Publish the stored chunks (``ok``) or give their slots back; in prefix order, the
        first becomes the most recently used (see :meth:`touch`)."""
        for key, slot in reversed(placed):
            started = self._storing.pop(key, None)
            assert started is not None and started[0] == slot, f"store of {key:x} not prepared"
            if ok and started[1] == self._generation:
                self._publish(key, slot)
            else:
                self._doomed.add(slot)
            self._unpin(slot)

    def touch(self, keys: Sequence[ChunkKey] | np.ndarray) -> None:
        """A request uses these chunks (a prefix, in order): the resident ones become the
        most recently used, the first one last, so that eviction takes a prefix from its
        tail. Evicting a head first would leave a tail no lookup can reach (a prefix
        match stops at its first miss). A pinned chunk takes its place when unpinned."""
        if len(keys) == 0:
            return
        arr = keys if isinstance(keys, np.ndarray) else keys_to_array(keys)
        found, slots = self._index.lookup_many(arr)
        for i in range(len(arr) - 1, -1, -1):
            if found[i]:
                self._policy.touch(SlotId(int(slots[i])))

    # ---- maintenance ----
    def seed(self, entries: Mapping[ChunkKey, SlotId]) -> int:
        """Publish chunks already in place (an SSD store found at start-up); returns how many.

        Only for a fresh tier; entries with a slot out of range or used twice are skipped.
        """
        assert len(self._free) == self.num_slots, "seed() a fresh tier only"
        taken: set[SlotId] = set()
        for key, slot in entries.items():
            if 0 <= slot < self.num_slots and slot not in taken:
                taken.add(slot)
                self._slot_key[slot] = key
                self._publish(key, slot)
                self._policy.touch(slot)
        self._free = [s for s in self._free if s not in taken]
        return len(taken)

    def drop(self, key: ChunkKey) -> bool:
        """Forget a resident chunk (e.g. found corrupt); its slot is freed once unpinned."""
        slot = self.slot_of(key)
        if slot is None:
            return False
        self._unpublish(slot)
        if not self._policy.is_pinned(slot):
            self._release(slot)
        return True

    def clear(self) -> int:
        """Drop every resident chunk; chunks being moved are dropped once unpinned.

        Returns how many resident chunks were dropped. Stores in flight never
        publish: their bytes may come from before the reset (e.g. old weights).
        """
        self._generation += 1
        dropped = 0
        for _key, _tier, slot in list(self._index.items()):
            self._unpublish(slot)
            if not self._policy.is_pinned(slot):
                self._release(slot)
            dropped += 1
        return dropped

    def usage(self) -> TierUsage:
        pinned = self._policy.num_pinned()
        return TierUsage(
            self.tier, self.num_slots, len(self._index), pinned, len(self._free), self.evictions
        )

    def finish_eviction(self, slot: SlotId) -> None:
        """The chunk a keeper kept in ``slot`` was written elsewhere (or failed to be):
        drop it here; the slot is freed once no load pins it any more."""
        self._unpublish(slot)
        self._unpin(slot)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def evict_one(self, keeper: Keeper | None = None) -> bool:
        """Evict the policy's victim ahead of need: its slot is freed, or kept while
        ``keeper`` writes the chunk elsewhere. False: nothing is evictable."""
        victim = self._policy.evict()
        if victim is None:
            return False
        if not self._evict(victim, keeper):
            self._free.append(victim)
        return True

    def release_kept(self, slot: SlotId) -> bool:
        """Drop the chunk a keeper kept in ``slot`` now and free the slot (no load may be
        reading it); False: a load pins it, the slot stays as it is."""
        self._policy.unpin(slot)
        if self._policy.is_pinned(slot):
            self._policy.pin(slot)
            return False
        self._unpublish(slot)
        self._release(slot)
        return True

    def _allocate(self, keeper: Keeper | None) -> SlotId | None:
        if self._free:
            return self._free.pop()
        while True:  # a kept victim may make a reclaim possible (a full write-back backlog)
            if keeper is not None and keeper.reclaim(self, False):
                return self._free.pop()
            victim = self._policy.evict()
            if victim is None:
                forced = keeper is not None and keeper.reclaim(self, True)
                return self._free.pop() if forced else None
            if not self._evict(victim, keeper):
                return victim

    def _evict(self, victim: SlotId, keeper: Keeper | None) -> bool:
        """Evict ``victim``'s chunk. True: ``keeper`` keeps the slot (readable, pinned) until
        it lets go (a write-back); False: the slot is free for the caller."""
        key = self._slot_key[victim]
        assert key is not None and key not in self._storing
        self.evictions += 1
        if keeper is not None and keeper.keep(key, victim):
            self._policy.pin(victim)
            self._policy.touch(victim)
            return True
        self._delete(key)
        self._slot_key[victim] = None
        return False

    def _publish(self, key: ChunkKey, slot: SlotId) -> None:
        self._index.insert(key, self.tier, slot)
        if self.watch is not None:
            self.watch(True, key)

    def _delete(self, key: ChunkKey) -> None:
        self._index.delete(key)
        if self.watch is not None:
            self.watch(False, key)

    def _unpublish(self, slot: SlotId) -> None:
        key = self._slot_key[slot]
        if key is not None and self.slot_of(key) == slot:  # not a newer copy elsewhere
            self._delete(key)
        self._doomed.add(slot)

    def _unpin(self, slot: SlotId) -> None:
        self._policy.unpin(slot)
        if slot in self._doomed and not self._policy.is_pinned(slot):
            self._release(slot)

    def _release(self, slot: SlotId) -> None:
        self._doomed.discard(slot)
        self._policy.remove(slot)
        self._slot_key[slot] = None
        self._free.append(slot)
