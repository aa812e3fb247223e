"""The tier hierarchy on the scheduler side: the CPU tier over an optional SSD tier.

It decides where every chunk goes and never touches bytes:

* **Lookup** is a prefix match across tiers: a run of keys may alternate
  between CPU and SSD (a few compiled ``match`` calls, one per run).
* **Load** (:meth:`TierStack.acquire`): CPU chunks are pinned; an SSD-only chunk
  gets a fresh CPU slot (it is *promoted*: read SSD->CPU, then copied to the
  GPU) and its SSD slot is pinned for the read.
* **Demotion**: when the CPU tier evicts a chunk that SSD does not hold, an SSD
  slot is allocated and a :class:`~miniflex.plan.SlotCopy` is queued
  (:meth:`TierStack.take_demotions`). The scheduler sends demotions before any
  job of the same step, and workers run jobs in order, so the bytes are on
  their way to SSD before the CPU slot is overwritten. With ``write_through``
  every chunk stored on CPU is also queued for SSD (its CPU slot pinned until
  written).
* Every change is two-phase like :class:`SlotTier`'s: a chunk is visible in a
  tier only once its bytes are known to be there.

Example::

    stack = TierStack(cpu_slots=2, ssd_slots=8)
    placed = stack.cpu.prepare_store([a, b, c])  # c evicts nothing yet: 2 slots
    ...
    stack.take_demotions()  # [SlotCopy(a, cpu=0, ssd=..)] once c evicts a
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from miniflex.index import keys_to_array
from miniflex.plan import SlotCopy
from miniflex.tiers.slot_tier import SlotTier
from miniflex.types import ChunkKey, SlotId, Tier

__all__ = ["ChunkSource", "TierStack"]


@dataclass(frozen=True)
class ChunkSource:
    """Where one chunk of a load comes from: CPU slot ``cpu``, after a read from ``ssd`` if set."""

    key: ChunkKey
    cpu: SlotId
    ssd: SlotId | None = None

    @property
    def tier(self) -> Tier:
        return Tier.CPU if self.ssd is None else Tier.SSD


class TierStack:
    """CPU tier (``cpu``) plus optional SSD tier (``ssd``); see the module docstring."""

    def __init__(
        self,
        cpu_slots: int,
        cpu_policy: str = "lru",
        ssd_slots: int = 0,
        ssd_policy: str = "lru",
        write_through: bool = False,
    ) -> None:
        self.cpu = SlotTier(Tier.CPU, cpu_slots, cpu_policy, on_evict=self._demote)
        self.ssd = SlotTier(Tier.SSD, ssd_slots, ssd_policy) if ssd_slots > 0 else None
        self.write_through = write_through and self.ssd is not None
        self._demotions: list[SlotCopy] = []
        self._pinned_copies: set[SlotCopy] = set()  # write-through: CPU slot pinned until written
        self.dropped_demotions = 0  # evicted from CPU with no SSD slot to go to

    # ---- lookups (side-effect free) ----
    def match(self, keys: np.ndarray | Sequence[ChunkKey]) -> int:
        """Number of leading ``keys`` resident in some tier."""
        arr = keys if isinstance(keys, np.ndarray) else keys_to_array(list(keys))
        n = self.cpu.match(arr)
        if self.ssd is None:
            return n
        while n < len(arr):
            step = self.ssd.match(arr[n:])
            step += self.cpu.match(arr[n + step :]) if step else 0
            if step == 0:
                break
            n += step
        return n

    def residence(self, keys: Sequence[ChunkKey], cpu_prefix: int = 0) -> list[Tier]:
        """The fastest tier of each leading loadable key (stops at the first miss).

        A chunk on SSD that another load is promoting into the CPU tier right
        now counts as a miss: it cannot be promoted twice, and is visible in
        the CPU tier once that promotion completes. ``cpu_prefix``: how many
        leading keys the caller already matched in the CPU tier (one compiled
        ``cpu.match``), so they are not looked up again one by one.
        """
        out: list[Tier] = [Tier.CPU] * cpu_prefix
        for key in keys[cpu_prefix:]:
            if key in self.cpu:
                out.append(Tier.CPU)
            elif self.ssd is not None and key in self.ssd and not self.cpu.is_storing(key):
                out.append(Tier.SSD)
            else:  # a miss, or a chunk another request is promoting right now
                break
        return out

    # ---- loads ----
    def acquire(self, keys: Sequence[ChunkKey]) -> list[ChunkSource]:
        """Pin the leading resident ``keys`` for a load; may return fewer (never more).

        Every chunk is pinned in its tier first, so promoting an SSD chunk
        (which may evict from CPU, and demoting that may evict from SSD) never
        evicts a chunk of the same load. A promotion that finds no free CPU
        slot (all pinned) ends the load there.
        """
        where = self.residence(keys)
        keys = list(keys)[: len(where)]
        pinned = {
            tier: iter(
                self._tier(tier).prepare_load(
                    [k for k, t in zip(keys, where, strict=True) if t is tier]
                )
            )
            for tier in (Tier.CPU, Tier.SSD)
            if tier in where
        }
        out: list[ChunkSource] = []
        for i, (key, tier) in enumerate(zip(keys, where, strict=True)):
            slot = next(pinned[tier])
            if tier is Tier.CPU:
                out.append(ChunkSource(key, slot))
                continue
            placed = self.cpu.prepare_store([key])
            if not placed:
                self.ssd.complete_load([slot], ok=True)  # type: ignore[union-attr]
                for t in where[i + 1 :]:  # unpin the rest
                    self._tier(t).complete_load([next(pinned[t])], ok=True)
                break
            out.append(ChunkSource(key, placed[0][1], slot))
        return out

    def _tier(self, tier: Tier) -> SlotTier:
        if tier is Tier.CPU:
            return self.cpu
        assert self.ssd is not None
        return self.ssd

    def release(self, sources: Sequence[ChunkSource], ok: bool, bad_keys: set[ChunkKey]) -> None:
        """End a load: unpin; ``ok=False`` drops the CPU chunks; ``bad_keys`` failed their read."""
        for src in sources:
            if src.ssd is None:
                self.cpu.complete_load([src.cpu], ok)
                continue
            assert self.ssd is not None
            read_ok = src.key not in bad_keys
            self.ssd.complete_load([src.ssd], read_ok)  # a corrupt chunk is dropped for good
            self.cpu.complete_store([(src.key, src.cpu)], ok and read_ok)

    def cancel(self, sources: Sequence[ChunkSource]) -> None:
        """Undo :meth:`acquire` for a load never sent: unpin; promotion slots are freed unread."""
        for src in sources:
            if src.ssd is None:
                self.cpu.complete_load([src.cpu], ok=True)
            else:
                assert self.ssd is not None
                self.ssd.complete_load([src.ssd], ok=True)
                self.cpu.complete_store([(src.key, src.cpu)], ok=False)

    # ---- stores ----
    def prepare_store(self, keys: Sequence[ChunkKey]) -> list[tuple[ChunkKey, SlotId]]:
        return self.cpu.prepare_store(keys)

    def complete_store(self, placed: Sequence[tuple[ChunkKey, SlotId]], ok: bool) -> None:
        self.cpu.complete_store(placed, ok)
        if not (ok and self.write_through):
            return
        for key, slot in placed:
            if self.cpu.slot_of(key) == slot and self.cpu.prepare_load([key]):
                copy = self._to_ssd(key, slot)
                if copy is None:
                    self.cpu.complete_load([slot], ok=True)
                else:
                    self._pinned_copies.add(copy)

    # ---- demotions ----
    def take_demotions(self) -> list[SlotCopy]:
        """The CPU->SSD copies queued since the last call; send them before any other job."""
        out, self._demotions = self._demotions, []
        return out

    def has_demotions(self) -> bool:
        return bool(self._demotions)

    def complete_demotions(self, copies: Sequence[SlotCopy], failed: set[ChunkKey]) -> None:
        """Publish the chunks written to SSD; ``failed`` ones (disk full, I/O error) are freed."""
        assert self.ssd is not None
        for c in copies:
            self.ssd.complete_store([(c.key, c.ssd)], c.key not in failed)
            if c in self._pinned_copies:
                self._pinned_copies.discard(c)
                self.cpu.complete_load([c.cpu], ok=True)

    def _demote(self, key: ChunkKey, cpu_slot: SlotId) -> None:
        """``SlotTier`` eviction hook: write the evicted CPU chunk back to SSD."""
        if self.ssd is not None and not self.write_through:
            self._to_ssd(key, cpu_slot)

    def _to_ssd(self, key: ChunkKey, cpu_slot: SlotId) -> SlotCopy | None:
        assert self.ssd is not None
        if key in self.ssd or self.ssd.is_storing(key):
            return None
        placed = self.ssd.prepare_store([key])
        if not placed:
            self.dropped_demotions += 1
            return None
        copy = SlotCopy(key, cpu_slot, placed[0][1])
        self._demotions.append(copy)
        return copy

    # ---- maintenance ----
    def clear(self) -> int:
        """Drop every chunk of every tier (chunks being moved never publish); returns how many.

        Copies to SSD not yet sent are dropped too: sent after the reset, they
        would journal pre-reset bytes that a restart would serve.
        """
        if self.ssd is not None:
            pending, self._demotions = self._demotions, []
            self.complete_demotions(pending, {c.key for c in pending})
        return self.cpu.clear() + (self.ssd.clear() if self.ssd is not None else 0)
