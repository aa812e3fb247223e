"""Evictions as data: what the CPU tier's evictions leave to do comes out of the tier stack
as one :class:`DemotionBatch` (the copies to write to SSD, the evicted chunks for the remote
tier's write-back, and the counts of chunks dropped unwritten)."""

from __future__ import annotations

from miniflex.scheduler.remote_puts import RemotePuts
from miniflex.stats import TransferStats
from miniflex.tiers import TierStack
from miniflex.tiers.writeback import DemotionBatch, FixedCosts
from miniflex.types import ChunkKey, SlotId


def k(i: int) -> ChunkKey:
    return ChunkKey((i + 1) * 0x9E3779B97F4A7C15 % (1 << 128))


def store(stack: TierStack, keys: list[ChunkKey]) -> list[tuple[ChunkKey, SlotId]]:
    placed = stack.prepare_store(keys)
    stack.complete_store(placed, ok=True)
    return placed


def test_a_batch_lists_every_eviction_with_the_slot_that_still_holds_it() -> None:
    stack = TierStack(cpu_slots=2, keep_evictions=True)  # no SSD tier: nothing to write
    slots = dict(store(stack, [k(0)]) + store(stack, [k(1)]))
    assert not stack.has_demotions() and not stack.take_demotions()
    store(stack, [k(2)])  # evicts k(0), the least recently used
    assert stack.has_demotions()
    batch = stack.take_demotions()
    assert batch == DemotionBatch(copies=(), evicted=((k(0), slots[k(0)]),))
    assert k(0) not in stack.cpu and stack.cpu.slot_of(k(2)) == slots[k(0)]
    assert not stack.has_demotions() and stack.take_demotions() == DemotionBatch()


def test_without_keep_evictions_a_batch_lists_none() -> None:
    stack = TierStack(cpu_slots=2)
    for i in range(3):
        store(stack, [k(i)])
    assert stack.cpu.evictions == 1 and stack.take_demotions() == DemotionBatch()


def test_a_batch_holds_the_ssd_copies_beside_the_evictions() -> None:
    stack = TierStack(cpu_slots=4, ssd_slots=8, max_writeback=1, keep_evictions=True)
    for i in range(4):
        store(stack, [k(i)])  # the last store writes k(0) back ahead of need
    batch = stack.take_demotions()
    assert (
        [(c.key, c.cpu) for c in batch.copies]
        == list(batch.evicted)
        == [(k(0), batch.copies[0].cpu)]
    )
    assert k(0) in stack.cpu and stack.write_backlog == 1  # readable until written
    stack.complete_demotions(batch.copies, failed=set())
    assert k(0) not in stack.cpu and stack.match([k(0)]) == 1 and stack.write_backlog == 0


def test_a_reset_drops_the_evictions_not_taken_yet() -> None:
    # put after a reset, they would send pre-reset bytes to the shared store
    stack = TierStack(cpu_slots=2, keep_evictions=True)
    for i in range(3):
        store(stack, [k(i)])
    assert stack.has_demotions()
    stack.clear()
    assert not stack.has_demotions() and stack.take_demotions() == DemotionBatch()


def test_a_dropped_chunk_is_counted_in_the_batch_once() -> None:
    stack = TierStack(
        cpu_slots=4, ssd_slots=8, max_writeback=1, clock=lambda: 0.0, costs=FixedCosts()
    )
    stack.observe_writes(chunks=1, seconds=10.0)  # a slow disk: no write is worth waiting for
    for i in range(4):
        store(stack, [k(i)])  # the last store writes k(0) back ahead
    stack.take_demotions()  # sent: predicted to end in 10 s
    store(stack, [k(4)])  # the backlog is full: k(1) is evicted unwritten
    assert stack.take_demotions().skipped == 1 and stack.take_demotions().skipped == 0


def test_remote_write_back_puts_exactly_the_evicted_chunks() -> None:
    stats = TransferStats()
    evicted = ((k(0), SlotId(3)), (k(1), SlotId(1)))
    puts = RemotePuts("back", chunk_bytes=100).back(evicted, stats)
    assert [(p.key, p.cpu) for p in puts] == list(evicted)
    assert stats.remote_puts == 2 and stats.remote_put_bytes == 200
    assert RemotePuts("through", chunk_bytes=100).back(evicted, stats) == ()
    assert stats.remote_puts == 2
