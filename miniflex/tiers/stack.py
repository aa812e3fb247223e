"""The tier hierarchy on the scheduler side: the CPU tier over an optional SSD tier.

It decides where every chunk goes and never touches bytes:

* **Lookup** is a prefix match across tiers: a run of keys may alternate
  between CPU and SSD (a few compiled ``match`` calls, one per run).
* **Load** (:meth:`TierStack.acquire`): CPU chunks are pinned; an SSD-only chunk
  gets a fresh CPU slot (it is *promoted*: read SSD->CPU, then copied to the
  GPU) and its SSD slot is pinned for the read. Once the load holds as many CPU
  slots as the tier can spare (:attr:`TierStack.max_load_chunks`), or none can
  be freed, the rest of its SSD chunks are *streamed*: read into the worker's
  staging slots (numbered after the CPU tier's, reused in turn) and copied to
  the GPU from there, never entering the CPU tier.
* **Demotion** (write-back) of the chunks the CPU tier evicts, and **admission**
  to SSD: :class:`~miniflex.tiers.writeback.WriteBack`. Its results come out as data:
  :meth:`TierStack.take_demotions` gives one
  :class:`~miniflex.tiers.writeback.DemotionBatch` (the copies to write, and the evicted
  chunks for the remote tier), :meth:`TierStack.complete_demotions` takes its outcome.
* Every change is two-phase like :class:`SlotTier`'s: a chunk is visible in a
  tier only once its bytes are known to be there.

Example::

    stack = TierStack(cpu_slots=4, ssd_slots=8)  # writes back one chunk at a time
    stack.complete_store(stack.prepare_store([a, b, c]), ok=True)  # a slot is still free
    stack.complete_store(stack.prepare_store([d]), ok=True)  # the last one: write ahead
    batch = stack.take_demotions()  # batch.copies: [SlotCopy(a, cpu=0, ssd=0)]; a still in CPU
    stack.complete_demotions(batch.copies, failed=set())  # a on SSD only; its slot free
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from miniflex.index import keys_to_array
from miniflex.plan import SlotCopy
from miniflex.tiers.slot_tier import SlotTier
from miniflex.tiers.writeback import (
    WRITE_WAIT_S,
    DemotionBatch,
    FixedCosts,
    WriteBack,
    WriteBackCosts,
)
from miniflex.types import ChunkKey, SlotId, Tier

__all__ = ["WRITE_WAIT_S", "ChunkSource", "DemotionBatch", "TierStack"]


@dataclass(frozen=True)
class ChunkSource:
    """Where one chunk of a load comes from: CPU slot ``cpu``, after a read from ``ssd`` if set
    or from the remote store if ``remote`` (see :mod:`miniflex.tiers.remote_fetch`)."""

    key: ChunkKey
    cpu: SlotId
    ssd: SlotId | None = None
    remote: bool = False
    streamed: bool = False
    """``cpu`` is a staging slot: the chunk is read from ``ssd`` (or fetched, if ``remote``)
    and copied to the GPU from there, never published in the CPU tier."""

    @property
    def tier(self) -> Tier:
        if self.remote:
            return Tier.REMOTE
        return Tier.CPU if self.ssd is None else Tier.SSD


class TierStack:
    """CPU tier (``cpu``) plus optional SSD tier (``ssd``) and the write-back between them
    (``writeback``); see the module docstring."""

    def __init__(
        self,
        cpu_slots: int,
        cpu_policy: str = "lru",
        ssd_slots: int = 0,
        ssd_policy: str = "lru",
        write_through: bool = False,
        max_writeback: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        costs: WriteBackCosts | None = None,
        keep_evictions: bool = False,
        write_seconds: float | None = None,
        stream_slots: int = 0,
    ) -> None:
        """``max_writeback``: chunks being written back at once (None: a quarter of the CPU
        slots, at least 1). ``clock``: seconds, for the write-back predictions; ``costs``:
        what write-back and admission ask of the cost model (None: :class:`FixedCosts`,
        nothing known); ``keep_evictions``: list every chunk evicted from CPU in the next
        :class:`DemotionBatch` (the remote tier's write-back); ``write_seconds``:
        a chunk's write until writes are seen (None: unknown); ``stream_slots``: the
        workers' staging slots for streamed SSD reads and remote fetches (0: none, loads are
        capped at :attr:`max_load_chunks`)."""
        assert stream_slots == 0 or stream_slots >= 2, "a ring of one slot cannot overlap"
        self.stream_slots = stream_slots
        self.ssd = SlotTier(Tier.SSD, ssd_slots, ssd_policy) if ssd_slots > 0 else None
        self.writeback = WriteBack(
            self.ssd,
            write_through,
            max(1, cpu_slots // 4 if max_writeback is None else max_writeback),
            costs if costs is not None else FixedCosts(),
            clock,
            keep_evictions,
            write_seconds,
        )
        self.cpu = SlotTier(Tier.CPU, cpu_slots, cpu_policy)

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
    def acquire(self, keys: Sequence[ChunkKey], stream: bool = True) -> list[ChunkSource]:
        """Pin the leading resident ``keys`` for a load; may return fewer (never more).

        Every chunk is pinned in its tier first, so promoting an SSD chunk
        (which may evict from CPU, and demoting that may evict from SSD) never
        evicts a chunk of the same load. An SSD chunk is promoted while a CPU
        slot can be freed (with staging slots, only while the load holds fewer
        than :attr:`max_load_chunks`); after that it is streamed through the
        staging slots or, with none (or ``stream=False``: a load inside a step, whose every
        chunk is held at once), the load ends there.
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
        held, streamed = where.count(Tier.CPU), 0  # CPU slots this load pins; staging slots
        for i, (key, tier) in enumerate(zip(keys, where, strict=True)):
            slot = next(pinned[tier])
            if tier is Tier.CPU:
                out.append(ChunkSource(key, slot))
                continue
            if (landing := self.read_slot(key, held, streamed, stream)) is not None:
                into, staged = landing
                held, streamed = held + (not staged), streamed + staged
                out.append(ChunkSource(key, into, slot, streamed=staged))
            else:
                self.ssd.complete_load([slot], ok=True)  # type: ignore[union-attr]
                for t in where[i + 1 :]:  # unpin the rest
                    self._tier(t).complete_load([next(pinned[t])], ok=True)
                break
        self.writeback.write_ahead(self.cpu)
        return out

    def read_slot(
        self, key: ChunkKey, held: int, streamed: int, stream: bool = True
    ) -> tuple[SlotId, bool] | None:
        """Where a load's read of ``key`` (from SSD or the remote store) lands, as ``(slot,
        staged)``: a fresh CPU slot, pinned and invisible, while the load holds fewer than
        :attr:`max_load_chunks` CPU slots (``held``) and one can be freed; else the staging
        slot after the load's ``streamed`` ones, handed out in turn (with staging slots, and
        ``stream``). None: neither, and the load ends before ``key``."""
        if held < self.max_load_chunks or not self.stream_slots:
            placed = self.cpu.prepare_store([key], keeper=self.writeback)
            if placed:
                return placed[0][1], False
        if self.stream_slots and stream:
            return SlotId(self.cpu.num_slots + streamed % self.stream_slots), True
        return None

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
                if not src.streamed:
                    self.cpu.complete_store([(src.key, src.cpu)], ok and src.key not in bad_keys)
                continue
            if src.ssd is None:
                self.cpu.complete_load([src.cpu], ok)
                continue
            assert self.ssd is not None
            read_ok = src.key not in bad_keys
            self.ssd.complete_load([src.ssd], read_ok)  # a corrupt chunk is dropped for good
            if not src.streamed:
                self.cpu.complete_store([(src.key, src.cpu)], ok and read_ok)

    def cancel(self, sources: Sequence[ChunkSource]) -> None:
        """Undo :meth:`acquire` for a load never sent: unpin; promotion slots are freed unread."""
        for src in reversed(sources):
            if src.remote:
                if not src.streamed:
                    self.cpu.complete_store([(src.key, src.cpu)], ok=False)
            elif src.ssd is None:
                self.cpu.complete_load([src.cpu], ok=True)
            else:
                assert self.ssd is not None
                self.ssd.complete_load([src.ssd], ok=True)
                if not src.streamed:
                    self.cpu.complete_store([(src.key, src.cpu)], ok=False)

    @property
    def max_load_chunks(self) -> int:
        """The CPU slots one load may hold at once (its CPU chunks and promotions): the tier,
        less the ``max_writeback`` slots that may be being written. Without staging slots it
        is the longest load that reads from SSD; with them, SSD chunks past it stream."""
        if not self.writeback.reserves_slots:
            return self.cpu.num_slots
        return max(1, self.cpu.num_slots - self.writeback.max_writeback)

    def staged_prefix(self, tiers: Sequence[Tier]) -> int:
        """How many leading chunks of a load over ``tiers`` (each chunk's tier) can be staged
        in CPU slots now, when every read must land in one: :attr:`max_load_chunks` at most,
        and no more reads than the slots not pinned or only being written back (a store may
        take those, see :meth:`WriteBack.reclaim`), less the load's own CPU chunks (pinned
        first). Slots pinned by write-through copies or other jobs count as taken: a load
        promised them would fail at :meth:`acquire` and come back as load errors."""
        free = self.cpu.num_slots - self.cpu.usage().pinned_or_moving
        room = free + self.writeback.writing_back - tiers.count(Tier.CPU)
        n = 0
        for tier in tiers[: self.max_load_chunks]:
            if tier is not Tier.CPU:
                if room <= 0:
                    break
                room -= 1
            n += 1
        return n

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
        placed = self.cpu.prepare_store(keys, cold_from, keeper=self.writeback)
        self.writeback.write_ahead(self.cpu)
        return placed

    def complete_store(self, placed: Sequence[tuple[ChunkKey, SlotId]], ok: bool) -> None:
        """Publish (``ok``) or free the slots of :meth:`prepare_store`; see
        :meth:`SlotTier.complete_store` and, for write-through, :meth:`WriteBack.stored`."""
        self.cpu.complete_store(placed, ok)
        if ok:
            self.writeback.stored(self.cpu, placed)

    # ---- write-back ----
    def take_demotions(self) -> DemotionBatch:
        """What the CPU tier's evictions left to do since the last call: send the batch's
        copies (and its evicted chunks' puts) as the plan's first job."""
        return self.writeback.take_batch()

    def complete_demotions(self, copies: Sequence[SlotCopy], failed: set[ChunkKey]) -> None:
        """The workers wrote ``copies`` except ``failed`` (disk full, I/O error; freed):
        publish the others on SSD and free their CPU slots."""
        self.writeback.complete_demotions(self.cpu, copies, failed)

    def observe_writes(self, chunks: int, seconds: float) -> None:
        """A worker wrote a batch of ``chunks`` in ``seconds``: the write-back's speed."""
        self.writeback.observe_writes(chunks, seconds)

    def has_demotions(self) -> bool:
        """Whether a batch waits: copies to send, or evicted chunks to put."""
        return self.writeback.has_demotions()

    @property
    def write_backlog(self) -> int:
        """Chunks on their way to SSD, not reported written yet."""
        return self.writeback.backlog

    def landing(self, key: ChunkKey) -> bool:
        """Whether ``key`` is on its way to SSD with no copy readable anywhere meanwhile (its
        CPU slot was reclaimed before the write was reported): a lookup may wait for it."""
        return self.writeback.landing(key)

    @property
    def disk_keeps_up(self) -> bool:
        """Whether SSD writes a chunk faster than recomputing one takes, as seen so far."""
        return self.writeback.disk_keeps_up

    @property
    def ssd_takes_chunks(self) -> bool:
        """Whether the SSD tier takes the chunks stored now (write-through, or admitted)."""
        return self.writeback.takes_chunks

    @property
    def ssd_admits(self) -> bool:
        """Whether admission lets evicted chunks onto SSD (see :mod:`~miniflex.tiers.admission`)."""
        return self.writeback.ssd_pays_off

    # ---- maintenance ----
    def clear(self) -> int:
        """Drop every chunk of every tier (chunks being moved never publish); returns how many.

        Copies to SSD not yet sent are dropped too: sent after the reset, they
        would journal pre-reset bytes that a restart would serve (and evictions not
        taken yet are never put to the remote store).
        """
        self.writeback.drop_pending(self.cpu)
        return self.cpu.clear() + (self.ssd.clear() if self.ssd is not None else 0)
