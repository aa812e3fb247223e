"""The tier hierarchy on the scheduler side: the CPU tier over an optional SSD tier.

It decides where every chunk goes and never touches bytes:

* **Lookup** is a prefix match across tiers: a run of keys may alternate
  between CPU and SSD (a few compiled ``match`` calls, one per run).
* **Load** (:meth:`TierStack.acquire`): CPU chunks are pinned; an SSD-only chunk
  gets a fresh CPU slot (it is *promoted*: read SSD->CPU, then copied to the
  GPU) and its SSD slot is pinned for the read.
* **Demotion** (write-back): when the CPU tier evicts a chunk that SSD does
  not hold, an SSD slot is allocated and a :class:`~miniflex.plan.SlotCopy` is
  queued (:meth:`TierStack.take_demotions`). The chunk stays in its CPU slot,
  readable and pinned, until the copy is reported done; only then is the slot
  freed, and making room goes on with the next victim meanwhile. So a store
  never waits for the disk. Write-back starts ahead of need: after every
  store or promotion, the least recently used chunks are written until
  ``max_writeback`` slots are free or being written. At most ``max_writeback``
  chunks are written at once. Past that, making room takes the slot of the
  oldest chunk being written, sent or not (the worker waits for that write
  before it overwrites the slot, see the handler), if the disk *keeps up* (it
  writes a chunk faster than recomputing one takes, both as seen so far: then
  every queued write costs less than the chunk it saves), or else if that write
  is predicted to be done within the ``wait_budget``. Otherwise the victim is
  dropped unwritten (counted, see :meth:`TierStack.take_skipped_demotions`):
  on a disk slower than recomputing, a store never waits for it longer than
  that. When every other CPU slot is pinned the same rule decides between
  waiting and losing the chunk being placed. A server meets that case whenever
  a prompt of half the CPU tier follows another: the previous store is still in
  flight, and the chunks evicted for room are not sent to the disk yet. With
  ``write_through`` every chunk stored on CPU is also queued for SSD (its CPU
  slot pinned until written).
* **Admission** (:mod:`miniflex.tiers.admission`): while the disk is known to be
  slower than recomputing a chunk, evicted chunks are dropped, not written, and
  nothing is written ahead or set aside for write-back: the CPU tier works as
  if there were no SSD tier (chunks already on SSD are still found).
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
from miniflex.types import ChunkKey, SlotId, Tier

__all__ = ["WRITE_WAIT_S", "ChunkSource", "TierStack"]

WRITE_WAIT_S = 0.005
"""Default ``wait_budget``: the longest predicted wait for a write-back that making room
accepts rather than dropping a chunk."""


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


class TierStack:
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

    def touch(self, keys: np.ndarray) -> None:
        """A request was admitted with these chunk keys (its prefix, in order): every tier
        counts them as just used, a prefix's tail evicted before its head. Chunks that
        vLLM itself still holds are touched too: a prefix hot on the GPU stays in CPU for
        when vLLM evicts it."""
        self.cpu.touch(keys)
        if self.ssd is not None:
            self.ssd.touch(keys)

    # ---- stores ----
    def prepare_store(self, keys: Sequence[ChunkKey]) -> list[tuple[ChunkKey, SlotId]]:
        placed = self.cpu.prepare_store(keys)
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

    # ---- demotions ----
    def take_demotions(self) -> list[SlotCopy]:
        """The CPU->SSD copies queued since the last call; send them before any other job,
        as one job.

        The disk writes the jobs one after the other, and a worker knows a slot is written
        when its whole job is (a job that overwrites the slot waits that long): every
        write-back of the job is predicted to end when the last of its chunks does."""
        out, self._demotions = self._demotions, []
        if not out:
            return out
        start = max(self._disk_free_at, self._clock())
        self._disk_free_at = start + (self.write_seconds or 0.0) * len(out)
        for c in out:
            if c in self._writing_back:
                self._writing_back[c] = self._disk_free_at
        return out

    def observe_writes(self, chunks: int, seconds: float) -> None:
        """A write-back job of ``chunks`` took ``seconds`` on a worker (the prediction's speed)."""
        if chunks > 0 and seconds > 0:
            per = seconds / chunks
            self.write_seconds = (
                per if self.write_seconds is None else (0.7 * self.write_seconds + 0.3 * per)
            )

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
            elif self._taken_early.get(c.key) == c:
                del self._taken_early[c.key]  # its slot has a new owner already
            elif c in self._writing_back:
                del self._writing_back[c]
                self.cpu.finish_eviction(c.cpu)

    def _write_ahead(self) -> None:
        """Start writing back the least recently used CPU chunks while fewer than
        ``max_writeback`` CPU slots are free or being written (write-back mode only)."""
        if self.ssd is None or self.write_through or not self.ssd_pays_off:
            return
        while (
            self.cpu.free_slots + len(self._writing_back) < self.max_writeback
            and self.cpu.evict_one()
        ):
            pass

    def take_skipped_demotions(self) -> int:
        """Chunks evicted from CPU without a copy on SSD, because ``max_writeback`` chunks were
        being written already, since the last call."""
        n, self._skipped_demotions = self._skipped_demotions, 0
        return n

    def landing(self, key: ChunkKey) -> bool:
        """Whether ``key`` is on its way to SSD with no copy readable anywhere meanwhile (its
        CPU slot was reclaimed before the write was reported): a lookup may wait for it."""
        return key in self._taken_early

    @property
    def max_load_chunks(self) -> int:
        """The longest load that fits the CPU tier at once: every chunk of a load sits in a
        CPU slot (promoted ones too), and up to ``max_writeback`` slots may be being written."""
        if self.ssd is None or self.write_through or not self.ssd_pays_off:
            return self.cpu.num_slots
        return max(1, self.cpu.num_slots - self.max_writeback)

    @property
    def ssd_pays_off(self) -> bool:
        """Whether chunks are written back ahead of need and CPU slots kept for that: the
        SSD tier admits chunks (see :mod:`miniflex.tiers.admission`)."""
        return self.admission is None or self.admission.pays_off

    def take_declined_demotions(self) -> int:
        """Chunks evicted from CPU unwritten because the disk is slower than recompute, since
        the last call."""
        if self.admission is None:
            return 0
        n, self.admission.declined = self.admission.declined, 0
        return n

    @property
    def writing_back(self) -> int:
        """Chunks evicted from CPU that are still being written to SSD (held in CPU)."""
        return len(self._writing_back)

    def _demote(self, key: ChunkKey, cpu_slot: SlotId) -> bool:
        """``SlotTier`` eviction hook: start writing the evicted CPU chunk back to SSD.
        True: it is being written (its CPU slot is freed when that is done)."""
        if self._on_cpu_evict is not None:
            self._on_cpu_evict(key, cpu_slot)
        if self.ssd is None or self.write_through:
            return False
        if key in self.ssd or self.ssd.is_storing(key):
            return False  # already there: nothing to write
        if self.admission is not None and not self.admission.admits():
            return False
        if len(self._writing_back) >= self.max_writeback:
            self._skipped_demotions += 1
            return False
        copy = self._to_ssd(key, cpu_slot)
        if copy is None:
            return False
        self._writing_back[copy] = None
        return True

    def _reclaim(self, force: bool) -> bool:
        """``SlotTier`` hook, when no CPU slot is free: free the slot of the oldest write-back
        if the backlog is full (``force``: nothing else is left to evict, the chunk being
        placed is lost otherwise) and waiting for that write is worth it (see
        :meth:`_worth_waiting`). The write may not be sent yet: it goes out in the same plan,
        ahead of the job that overwrites its slot."""
        if not self._writing_back or (len(self._writing_back) < self.max_writeback and not force):
            return False
        copy, done_at = next(iter(self._writing_back.items()))
        if not self._worth_waiting(done_at):
            return False
        if not self.cpu.release_kept(copy.cpu):
            return False
        del self._writing_back[copy]
        self._taken_early[copy.key] = copy
        return True

    @property
    def disk_keeps_up(self) -> bool:
        """Whether the SSD writes a chunk faster than recomputing it takes (both as seen so
        far; False while either is unknown). Then waiting for the disk never loses: however
        many writes queue, each costs less than recomputing its chunk would."""
        rc = self._recompute_seconds()
        return self.write_seconds is not None and rc is not None and self.write_seconds <= rc

    def _worth_waiting(self, done_at: float | None) -> bool:
        """Whether a store should wait for the write predicted to end at ``done_at`` (None: not
        sent yet) rather than lose a chunk: always when the disk keeps up, else only for a
        write predicted to end within the wait budget."""
        if self.disk_keeps_up:
            return True
        return done_at is not None and done_at <= self._clock() + self._wait_budget()

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
            self._taken_early.clear()  # their writes still end, but never publish
        return self.cpu.clear() + (self.ssd.clear() if self.ssd is not None else 0)
