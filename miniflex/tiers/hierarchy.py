"""The tier hierarchy on the scheduler side: the CPU tier over an optional SSD tier.

It decides where every chunk goes and never touches bytes:

* **Lookup** is a prefix match across tiers: a run of keys may alternate
  between CPU and SSD (a few compiled ``match`` calls, one per run).
* **Load** (:meth:`TierStack.acquire`): CPU chunks are pinned; an SSD-only chunk
  gets a fresh CPU slot (it is *promoted*: read SSD->CPU, then copied to the
  GPU) and its SSD slot is pinned for the read.
* **Demotion** (write-back) of the chunks the CPU tier evicts, and **admission**
  to SSD: :mod:`miniflex.tiers.writeback`.
* Every change is two-phase like :class:`SlotTier`'s: a chunk is visible in a
  tier only once its bytes are known to be there.

Example::

    stack = TierStack(cpu_slots=4, ssd_slots=8)  # writes back one chunk at a time
    stack.complete_store(stack.prepare_store([a, b, c]), ok=True)  # a slot is still free
    stack.complete_store(stack.prepare_store([d]), ok=True)  # the last one: write ahead
    copies = stack.take_demotions()  # [SlotCopy(a, cpu=0, ssd=0)]; a still served from CPU
    stack.complete_demotions(copies, failed=set())  # a is on SSD only; its CPU slot is free
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from miniflex.index import keys_to_array
from miniflex.plan import SlotCopy
from miniflex.tiers.admission import SSDAdmission
from miniflex.tiers.slot_tier import SlotTier
from miniflex.tiers.writeback import WRITE_WAIT_S, SSDWriteBack
from miniflex.types import ChunkKey, SlotId, Tier

__all__ = ["WRITE_WAIT_S", "ChunkSource", "TierStack"]


@dataclass(frozen=True)
class ChunkSource:
    """Where one chunk of a load comes from: CPU slot ``cpu``, after a read from ``ssd`` if set
    or from the remote store if ``remote`` (see :mod:`miniflex.tiers.remote_fetch`)."""

    key: ChunkKey
    cpu: SlotId
    ssd: SlotId | None = None
    remote: bool = False

    @property
    def tier(self) -> Tier:
        if self.remote:
            return Tier.REMOTE
        return Tier.CPU if self.ssd is None else Tier.SSD


class TierStack(SSDWriteBack):
    """CPU tier (``cpu``) plus optional SSD tier (``ssd``); see the module docstring."""

    def __init__(
        self,
        cpu_slots: int,
        cpu_policy: str = "lru",
        ssd_slots: int = 0,
        ssd_policy: str = "lru",
        write_through: bool = False,
        max_writeback: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        wait_budget: Callable[[], float] = lambda: WRITE_WAIT_S,
        recompute_seconds: Callable[[], float | None] = lambda: None,
        admission: SSDAdmission | None = None,
        on_cpu_evict: Callable[[ChunkKey, SlotId], None] | None = None,
    ) -> None:
        """``max_writeback``: chunks being written back at once (None: a quarter of the CPU
        slots, at least 1). ``clock``: seconds, for the write-back predictions;
        ``wait_budget()``: seconds a store may wait for a write-back rather than drop one;
        ``recompute_seconds()``: what recomputing one chunk costs (None: not known yet);
        ``admission``: whether evicted chunks are worth writing to SSD (None: always);
        ``on_cpu_evict(key, slot)``: told of every chunk evicted from CPU, while its slot
        still holds it (the remote tier's write-back)."""
        self.cpu = SlotTier(
            Tier.CPU, cpu_slots, cpu_policy, on_evict=self._demote, reclaim=self._reclaim
        )
        self.ssd = SlotTier(Tier.SSD, ssd_slots, ssd_policy) if ssd_slots > 0 else None
        self.write_through = write_through and self.ssd is not None
        self.max_writeback = max(1, cpu_slots // 4 if max_writeback is None else max_writeback)
        self._clock = clock
        self._wait_budget = wait_budget
        self._recompute_seconds = recompute_seconds
        self.admission = admission
        self._on_cpu_evict = on_cpu_evict
        # evicted from CPU once written; in the order sent, with the predicted end of the
        # write (None: not sent to the workers yet)
        self._writing_back: OrderedDict[SlotCopy, float | None] = OrderedDict()
        self._taken_early: dict[ChunkKey, SlotCopy] = {}  # slot reclaimed before the write
        # was seen: the chunk is in neither tier until the write is reported
        self._disk_free_at = 0.0  # when the writes sent so far are predicted to be done
        self.write_seconds: float | None = None
        """Seconds to write one chunk, as seen (None: none seen, and no estimate given)."""
        self._skipped_demotions = 0  # evicted while max_writeback chunks were being written
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
        self._write_ahead()
        return out

    def _tier(self, tier: Tier) -> SlotTier:
        if tier is Tier.CPU:
            return self.cpu
        assert self.ssd is not None
        return self.ssd

    def release(self, sources: Sequence[ChunkSource], ok: bool, bad_keys: set[ChunkKey]) -> None:
        """End a load: unpin (the prefix's first chunk last: most recently used);
        ``ok=False`` drops the CPU chunks; ``bad_keys`` failed their read."""
        for src in reversed(sources):
            if src.remote:  # fetched into a fresh CPU slot: published if it loaded
                self.cpu.complete_store([(src.key, src.cpu)], ok and src.key not in bad_keys)
                continue
            if src.ssd is None:
                self.cpu.complete_load([src.cpu], ok)
                continue
            assert self.ssd is not None
            read_ok = src.key not in bad_keys
            self.ssd.complete_load([src.ssd], read_ok)  # a corrupt chunk is dropped for good
            self.cpu.complete_store([(src.key, src.cpu)], ok and read_ok)

    def cancel(self, sources: Sequence[ChunkSource]) -> None:
        """Undo :meth:`acquire` for a load never sent: unpin; promotion slots are freed unread."""
        for src in reversed(sources):
            if src.remote:
                self.cpu.complete_store([(src.key, src.cpu)], ok=False)
            elif src.ssd is None:
                self.cpu.complete_load([src.cpu], ok=True)
            else:
                assert self.ssd is not None
                self.ssd.complete_load([src.ssd], ok=True)
                self.cpu.complete_store([(src.key, src.cpu)], ok=False)

    @property
    def max_load_chunks(self) -> int:
        """The longest load that fits the CPU tier at once: every chunk of a load sits in a
        CPU slot (promoted ones too), and up to ``max_writeback`` slots may be being written."""
        if self.ssd is None or self.write_through or not self.ssd_pays_off:
            return self.cpu.num_slots
        return max(1, self.cpu.num_slots - self.max_writeback)

    def touch(self, keys: np.ndarray) -> None:
        """A request was admitted with these chunk keys (its prefix, in order): every tier
        counts them as just used, a prefix's tail evicted before its head. Chunks that
        vLLM itself still holds are touched too: a prefix hot on the GPU stays in CPU for
        when vLLM evicts it."""
        self.cpu.touch(keys)
        if self.ssd is not None:
            self.ssd.touch(keys)

    # ---- stores ----
    def prepare_store(
        self, keys: Sequence[ChunkKey], cold_from: int | None = None
    ) -> list[tuple[ChunkKey, SlotId]]:
        """CPU slots for ``keys`` (see :meth:`SlotTier.prepare_store`)."""
        placed = self.cpu.prepare_store(keys, cold_from)
        self._write_ahead()
        return placed

    def complete_store(self, placed: Sequence[tuple[ChunkKey, SlotId]], ok: bool) -> None:
        self.cpu.complete_store(placed, ok)
        if not (ok and self.write_through):
            return
        for key, slot in placed:
            if self.admission is not None and not self.admission.admits():
                continue
            if self.cpu.slot_of(key) == slot and self.cpu.prepare_load([key]):
                copy = self._to_ssd(key, slot)
                if copy is None:
                    self.cpu.complete_load([slot], ok=True)
                else:
                    self._pinned_copies.add(copy)

    # ---- maintenance ----
    def clear(self) -> int:
        """Drop every chunk of every tier (chunks being moved never publish); returns how many.

        Copies to SSD not yet sent are dropped too: sent after the reset, they
        would journal pre-reset bytes that a restart would serve.
        """
        if self.ssd is not None:
            pending, self._demotions = self._demotions, []
            self.complete_demotions(pending, {c.key for c in pending})
            self._taken_early.clear()  # their writes still end, but never publish
        return self.cpu.clear() + (self.ssd.clear() if self.ssd is not None else 0)
