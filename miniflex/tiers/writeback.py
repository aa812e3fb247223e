"""SSD write-back of the CPU tier's evictions, and admission to SSD: :class:`TierStack`'s part.

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
  dropped unwritten (counted, see :class:`DemotionBatch`):
  on a disk slower than recomputing, a store never waits for it longer than
  that. When every other CPU slot is pinned the same rule decides between
  waiting and losing the chunk being placed. A server meets that case whenever
  a prompt of half the CPU tier follows another: the previous store is still in
  flight, and the chunks evicted for room are not sent to the disk yet. With
  ``write_through`` every chunk stored on CPU is also queued for SSD (its CPU
  slot pinned until written), whatever admission says: the operator asked for
  every chunk on disk (e.g. to keep it across restarts).
* **Admission** (:mod:`miniflex.tiers.admission`, write-back only): while the
  disk is known to be slower than recomputing a chunk, evicted chunks are
  dropped, not written, and nothing is written ahead or set aside for
  write-back: the CPU tier works as if there were no SSD tier (chunks already
  on SSD are still found).

:class:`WriteBack` is the policy, owned by the
:class:`~miniflex.tiers.stack.TierStack` (``stack.writeback``); it asks the
cost model through one interface, :class:`WriteBackCosts`, and nothing else.
Neither it nor the CPU tier holds the other: the stack passes it as the
:class:`~miniflex.tiers.slot_tier.Keeper` of each CPU call that may evict, and
passes the CPU tier to each of its calls that changes a CPU slot::

    wb = WriteBack(ssd_tier, write_through=False, max_writeback=2, costs=FixedCosts())
    cpu = SlotTier(Tier.CPU, 8)
    placed = cpu.prepare_store(keys, keeper=wb)  # evictions may become SSD copies
    wb.write_ahead(cpu)
    wb.complete_demotions(cpu, wb.take_demotions(), failed=set())
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from miniflex.plan import SlotCopy
from miniflex.tiers.admission import SSDAdmission
from miniflex.tiers.slot_tier import SlotTier
from miniflex.types import ChunkKey, SlotId

__all__ = ["WRITE_WAIT_S", "DemotionBatch", "FixedCosts", "WriteBack", "WriteBackCosts"]

WRITE_WAIT_S = 0.005
"""Default ``wait_budget``: the longest predicted wait for a write-back that making room
accepts rather than dropping a chunk."""


class WriteBackCosts(Protocol):
    """What write-back asks of the cost model (scheduler side): its one interface to it."""

    def write_wait_budget(self) -> float:
        """Seconds a store may wait for a write-back rather than drop a chunk."""

    def chunk_recompute_seconds(self) -> float | None:
        """Seconds to recompute one chunk, the cheapest (None: not known yet)."""

    def costliest_recompute_seconds(self) -> float | None:
        """Seconds to recompute the costliest chunk the engine computes (None: not known)."""

    def rough_recompute_seconds(self) -> float | None:
        """Until that is known: a rough figure for it that prices recompute high (None: none
        either); see :mod:`miniflex.tiers.admission`."""

    def ssd_chunk_seconds(self) -> float | None:
        """Seconds to read one chunk from SSD, as measured (None: not measured yet)."""


@dataclass(frozen=True)
class FixedCosts:
    """:class:`WriteBackCosts` of fixed figures (None: unknown); the default of a bare stack."""

    wait_budget: float = WRITE_WAIT_S
    recompute: float | None = None
    costliest: float | None = None
    rough: float | None = None
    ssd_read: float | None = None

    def write_wait_budget(self) -> float:
        return self.wait_budget

    def chunk_recompute_seconds(self) -> float | None:
        return self.recompute

    def costliest_recompute_seconds(self) -> float | None:
        return self.costliest

    def rough_recompute_seconds(self) -> float | None:
        return self.rough

    def ssd_chunk_seconds(self) -> float | None:
        return self.ssd_read


@dataclass(frozen=True)
class DemotionBatch:
    """What the CPU tier's evictions left to do since the last batch: the data a DEMOTE job
    is planned from (see :meth:`TierStack.take_demotions`)."""

    copies: tuple[SlotCopy, ...] = ()
    """CPU->SSD writes to send, as one job ahead of any other; each CPU slot stays pinned
    and readable until the write is reported (:meth:`TierStack.complete_demotions`)."""
    evicted: tuple[tuple[ChunkKey, SlotId], ...] = ()
    """Every chunk evicted from CPU, with the slot that still holds it until a later job of
    the same plan may overwrite it (listed only where the stack keeps evictions: the remote
    tier's write-back puts them)."""
    skipped: int = 0
    """Evicted unwritten: ``max_writeback`` chunks were being written already."""
    declined: int = 0
    """Evicted unwritten: admission found the disk slower than recompute."""

    def __bool__(self) -> bool:
        """Whether a job is needed: copies to write or evicted chunks to put."""
        return bool(self.copies or self.evicted)


class WriteBack:
    """Demotions (CPU->SSD copies of evicted chunks), their timing, and admission to SSD."""

    def __init__(
        self,
        ssd: SlotTier | None,
        write_through: bool,
        max_writeback: int,
        costs: WriteBackCosts,
        clock: Callable[[], float] = time.monotonic,
        keep_evictions: bool = False,
        write_seconds: float | None = None,
    ) -> None:
        """``ssd``: the SSD tier (None: none, nothing is written); ``max_writeback``: chunks
        being written back at once; ``clock``: seconds, for the predictions;
        ``keep_evictions``: list every chunk evicted from CPU in the next batch's
        ``evicted`` (the remote tier's write-back); ``write_seconds``: the estimate of a
        chunk's write until writes are seen (None: none)."""
        self.ssd = ssd
        self.write_through = write_through and ssd is not None
        self.max_writeback = max_writeback
        self._costs = costs
        self._clock = clock
        self._evicted: list[tuple[ChunkKey, SlotId]] | None = [] if keep_evictions else None
        self.admission = (
            SSDAdmission(
                costs.ssd_chunk_seconds,
                costs.costliest_recompute_seconds,
                clock,
                costs.rough_recompute_seconds,
            )
            if ssd is not None and not self.write_through
            else None
        )  # write-through writes every chunk: nothing to decide
        # evicted from CPU once written; in the order sent, with the predicted end of the
        # write (None: not sent to the workers yet)
        self._writing_back: OrderedDict[SlotCopy, float | None] = OrderedDict()
        self._taken_early: dict[ChunkKey, SlotCopy] = {}  # slot reclaimed before the write
        # was seen: the chunk is in neither tier until the write is reported
        self._disk_free_at = 0.0  # when the writes sent so far are predicted to be done
        self.write_seconds = write_seconds
        """Seconds to write one chunk, as seen (None: none seen, and no estimate given)."""
        self._skipped_demotions = 0  # evicted while max_writeback chunks were being written
        self._demotions: list[SlotCopy] = []
        self._pinned_copies: set[SlotCopy] = set()  # write-through: CPU slot pinned until written
        self.dropped_demotions = 0  # evicted from CPU with no SSD slot to go to

    def take_batch(self) -> DemotionBatch:
        """What write-back did since the last call, as one :class:`DemotionBatch` (its
        ``copies`` as :meth:`take_demotions` gives them)."""
        evicted: tuple[tuple[ChunkKey, SlotId], ...] = ()
        if self._evicted:
            evicted, self._evicted = tuple(self._evicted), []
        return DemotionBatch(
            tuple(self.take_demotions()),
            evicted,
            self.take_skipped_demotions(),
            self.take_declined_demotions(),
        )

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
        """Whether the next batch holds work: copies to send or evicted chunks to put."""
        return bool(self._demotions or self._evicted)

    def complete_demotions(
        self, cpu: SlotTier, copies: Sequence[SlotCopy], failed: set[ChunkKey]
    ) -> None:
        """Publish the chunks written to SSD; ``failed`` ones (disk full, I/O error) are freed
        (and their slots in ``cpu`` let go)."""
        assert self.ssd is not None
        for c in copies:
            self.ssd.complete_store([(c.key, c.ssd)], c.key not in failed)
            if c in self._pinned_copies:
                self._pinned_copies.discard(c)
                cpu.complete_load([c.cpu], ok=True)
            elif self._taken_early.get(c.key) == c:
                del self._taken_early[c.key]  # its slot has a new owner already
            elif c in self._writing_back:
                del self._writing_back[c]
                cpu.finish_eviction(c.cpu)

    def write_ahead(self, cpu: SlotTier) -> None:
        """Start writing back the least recently used chunks of ``cpu`` while fewer than
        ``max_writeback`` of its slots are free or being written (write-back mode only)."""
        if not self.reserves_slots:
            return
        while cpu.free_slots + len(self._writing_back) < self.max_writeback and cpu.evict_one(self):
            pass

    @property
    def reserves_slots(self) -> bool:
        """Whether ``max_writeback`` CPU slots are kept free or being written: write-back
        (not write-through) to an SSD tier that admits chunks."""
        return self.ssd is not None and not self.write_through and self.ssd_pays_off

    def stored(self, cpu: SlotTier, placed: Sequence[tuple[ChunkKey, SlotId]]) -> None:
        """Chunks just published in the CPU tier: with write-through, queue each for SSD
        (its CPU slot pinned until written). Admission is not asked: write-through is an
        explicit setting (the default is write-back)."""
        if not self.write_through:
            return
        for key, slot in placed:
            if cpu.slot_of(key) == slot and cpu.prepare_load([key]):
                copy = self._to_ssd(key, slot)
                if copy is None:
                    cpu.complete_load([slot], ok=True)
                else:
                    self._pinned_copies.add(copy)

    def drop_pending(self, cpu: SlotTier) -> None:
        """A reset: copies not yet sent are dropped (sent after the reset, they would
        journal pre-reset bytes that a restart would serve); writes in flight never
        publish. Evicted chunks not taken yet are dropped too (never put)."""
        if self._evicted:
            self._evicted.clear()
        if self.ssd is None:
            return
        pending, self._demotions = self._demotions, []
        self.complete_demotions(cpu, pending, {c.key for c in pending})
        self._taken_early.clear()

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
    def takes_chunks(self) -> bool:
        """Whether the SSD tier takes the chunks stored now: write-through, or write-back
        while admission admits (see :mod:`miniflex.tiers.admission`)."""
        return self.ssd is not None and (self.write_through or self.ssd_pays_off)

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

    @property
    def backlog(self) -> int:
        """Chunks on their way to SSD, not reported written yet: write-backs and write-throughs."""
        return len(self._writing_back) + len(self._pinned_copies)

    def keep(self, key: ChunkKey, cpu_slot: SlotId) -> bool:
        """:class:`~miniflex.tiers.slot_tier.Keeper`: start writing the chunk the CPU tier
        evicts back to SSD. True: it is being written (its CPU slot is freed when that is
        done)."""
        if self._evicted is not None:
            self._evicted.append((key, cpu_slot))
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

    def reclaim(self, tier: SlotTier, force: bool) -> bool:
        """:class:`~miniflex.tiers.slot_tier.Keeper`, when no slot of the CPU tier ``tier`` is
        free: free the slot of the oldest write-back
        if the backlog is full (``force``: nothing else is left to evict, the chunk being
        placed is lost otherwise) and waiting for that write is worth it (see
        :meth:`_worth_waiting`). The write may not be sent yet: it goes out in the same plan,
        ahead of the job that overwrites its slot."""
        if not self._writing_back or (len(self._writing_back) < self.max_writeback and not force):
            return False
        copy, done_at = next(iter(self._writing_back.items()))
        if not self._worth_waiting(done_at):
            return False
        if not tier.release_kept(copy.cpu):
            return False
        del self._writing_back[copy]
        self._taken_early[copy.key] = copy
        return True

    @property
    def disk_keeps_up(self) -> bool:
        """Whether the SSD writes a chunk faster than recomputing it takes (both as seen so
        far; False while either is unknown). Then waiting for the disk never loses: however
        many writes queue, each costs less than recomputing its chunk would."""
        rc = self._costs.chunk_recompute_seconds()
        return self.write_seconds is not None and rc is not None and self.write_seconds <= rc

    def _worth_waiting(self, done_at: float | None) -> bool:
        """Whether a store should wait for the write predicted to end at ``done_at`` (None: not
        sent yet) rather than lose a chunk: always when the disk keeps up, else only for a
        write predicted to end within the wait budget."""
        if self.disk_keeps_up:
            return True
        return done_at is not None and done_at <= self._clock() + self._costs.write_wait_budget()

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
