"""The CPU-over-SSD hierarchy's bookkeeping: lookups, promotion, demotion, failures."""

from __future__ import annotations

from miniflex.plan import SlotCopy
from miniflex.tiers import TierStack
from miniflex.types import ChunkKey, SlotId, Tier


def k(i: int) -> ChunkKey:
    return ChunkKey((i + 1) * 0x9E3779B97F4A7C15 % (1 << 128))


def store(stack: TierStack, keys: list[ChunkKey]) -> list[tuple[ChunkKey, SlotId]]:
    placed = stack.prepare_store(keys)
    stack.complete_store(placed, ok=True)
    return placed


def demote_all(stack: TierStack, failed: set[ChunkKey] | None = None) -> tuple[SlotCopy, ...]:
    copies = stack.take_demotions().copies
    stack.complete_demotions(copies, failed or set())
    return copies


def pinned(stack: TierStack) -> tuple[int, int]:
    assert stack.ssd is not None
    return stack.cpu.usage().pinned_or_moving, stack.ssd.usage().pinned_or_moving


def test_write_back_starts_ahead_of_need_and_the_chunk_stays_readable_until_written() -> None:
    stack = TierStack(cpu_slots=4, ssd_slots=8, max_writeback=1)
    placed = store(stack, [k(0), k(1), k(2)])
    assert stack.take_demotions().copies == ()  # one slot is still free
    store(stack, [k(3)])  # takes it: the least recently used chunk starts its write-back
    (copy,) = stack.take_demotions().copies  # the tail of the older prefix: its head stays useful
    assert copy.key == k(2) and copy.cpu == dict(placed)[k(2)]
    assert k(2) in stack.cpu and stack.match([k(2)]) == 1  # still served from CPU
    assert stack.writeback.writing_back == 1 and stack.cpu.free_slots == 0
    assert stack.write_backlog == 1  # what /metrics shows as the write-back backlog
    stack.complete_demotions([copy], set())
    assert stack.write_backlog == 0
    assert stack.ssd is not None and k(2) in stack.ssd and k(2) not in stack.cpu
    assert stack.cpu.free_slots == 1  # the next store takes it without waiting
    assert stack.match([k(0), k(1), k(2), k(3)]) == 4  # a prefix across both tiers


def test_a_chunk_loaded_while_it_is_written_back_keeps_its_slot_until_the_load_ends() -> None:
    stack = TierStack(cpu_slots=4, ssd_slots=8, max_writeback=1)
    for i in range(4):
        store(stack, [k(i)])  # k(0) is being written back
    sources = stack.acquire([k(0)])
    assert [s.tier for s in sources] == [Tier.CPU]
    copies = stack.take_demotions().copies  # sent; no speed seen yet, so predicted done at once
    store(stack, [k(4)])  # yet its slot is not taken from under the load: k(1) goes instead
    assert k(0) in stack.cpu and stack.match([k(1)]) == 0
    stack.complete_demotions(copies, set())  # written: dropped from CPU, the load still reads
    assert stack.cpu.free_slots == 0 and k(0) not in stack.cpu
    stack.release(sources, ok=True, bad_keys=set())
    assert stack.cpu.free_slots == 1 and pinned(stack) == (0, 0)
    assert stack.match([k(0)]) == 1  # on SSD


def test_failed_write_back_is_not_published() -> None:
    stack = TierStack(cpu_slots=1, ssd_slots=4)
    store(stack, [k(0)])
    store(stack, [k(1)])
    demote_all(stack, failed={k(0)})
    assert stack.match([k(0)]) == 0
    assert stack.ssd is not None and stack.ssd.usage().free == 4


def test_match_alternates_between_tiers_and_stops_at_the_first_miss() -> None:
    stack = TierStack(cpu_slots=2, ssd_slots=8)
    for i in range(4):
        store(stack, [k(i)])
        demote_all(stack)
    # CPU holds k(2), k(3); SSD holds k(0), k(1)
    assert stack.match([k(0), k(1), k(2), k(3), k(9), k(0)]) == 4
    assert stack.match([k(2), k(0), k(3), k(1)]) == 4
    assert stack.match([k(9), k(0)]) == 0


def test_promotion_reads_into_a_fresh_cpu_slot_and_publishes_it() -> None:
    stack = TierStack(cpu_slots=2, ssd_slots=8)
    for i in range(4):
        store(stack, [k(i)])
        demote_all(stack)
    # write-back runs one chunk ahead: CPU holds k(3) and a free slot, SSD k(0..2)
    sources = stack.acquire([k(0), k(3)])
    assert [s.tier for s in sources] == [Tier.SSD, Tier.CPU]
    assert stack.ssd is not None and sources[0].ssd == stack.ssd.slot_of(k(0))
    # k(0)'s fresh CPU slot and k(3)'s are pinned, and k(0)'s SSD slot for the read
    assert pinned(stack) == (2, 1)
    assert k(0) not in stack.cpu  # visible in CPU only once read
    stack.release(sources, ok=True, bad_keys=set())
    assert pinned(stack) == (0, 0)
    assert k(0) in stack.cpu and k(0) in stack.ssd  # promoted; the SSD copy stays


def test_a_corrupt_chunk_is_dropped_from_ssd_and_not_published_on_cpu() -> None:
    stack = TierStack(cpu_slots=2, ssd_slots=4)
    store(stack, [k(0)])
    store(stack, [k(1)])  # starts k(0)'s write-back
    demote_all(stack)
    sources = stack.acquire([k(0)])
    stack.release(sources, ok=True, bad_keys={k(0)})
    demote_all(stack)  # k(1), written ahead once the promotion took the free slot
    assert stack.match([k(0)]) == 0
    assert stack.match([k(1)]) == 1
    assert pinned(stack) == (0, 0)


def test_promotion_without_a_free_cpu_slot_ends_the_load_and_unpins_the_rest() -> None:
    stack = TierStack(cpu_slots=1, ssd_slots=8)
    for i in range(3):
        store(stack, [k(i)])
        demote_all(stack)
    # CPU: k(2); SSD: k(0), k(1). Load k(2) (pins the only CPU slot), then k(0), k(1).
    sources = stack.acquire([k(2), k(0), k(1)])
    assert [s.key for s in sources] == [k(2)]
    assert pinned(stack) == (1, 0)
    stack.release(sources, ok=True, bad_keys=set())
    assert pinned(stack) == (0, 0)


def test_promoting_never_evicts_a_chunk_of_the_same_load_from_a_full_ssd() -> None:
    stack = TierStack(cpu_slots=2, ssd_slots=2)
    for i in range(3):
        store(stack, [k(i)])
        demote_all(stack)
    # CPU: k(2) and a free slot; SSD (full): k(0), k(1). k(0) is read into the free slot;
    # k(1)'s promotion evicts k(2), whose write-back needs an SSD slot: k(0) and k(1) are
    # pinned, so it is dropped.
    sources = stack.acquire([k(0), k(1)])
    assert [s.key for s in sources] == [k(0), k(1)]
    assert stack.take_demotions().copies == () and stack.writeback.dropped_demotions == 1
    stack.release(sources, ok=True, bad_keys=set())
    assert stack.match([k(0), k(1)]) == 2


def test_cancelled_promotion_frees_its_slot_unpublished() -> None:
    stack = TierStack(cpu_slots=2, ssd_slots=4)
    store(stack, [k(0)])
    store(stack, [k(1), k(2)])
    demote_all(stack)
    sources = stack.acquire([k(0)])
    stack.cancel(sources)
    demote_all(stack)  # k(1), evicted to make room for the promotion
    assert pinned(stack) == (0, 0)
    assert k(0) not in stack.cpu and stack.match([k(0)]) == 1  # still on SSD only


def test_write_through_copies_every_stored_chunk_with_its_cpu_slot_pinned() -> None:
    stack = TierStack(cpu_slots=2, ssd_slots=4, write_through=True)
    store(stack, [k(0), k(1)])
    copies = stack.take_demotions().copies
    assert [c.key for c in copies] == [k(0), k(1)]
    assert pinned(stack) == (2, 2) and stack.write_backlog == 2
    stack.complete_demotions(copies, set())
    assert pinned(stack) == (0, 0) and stack.write_backlog == 0
    store(stack, [k(2)])  # evicting k(0) writes nothing: SSD already holds it
    assert [c.key for c in stack.take_demotions().copies] == [k(2)]


def test_clear_forgets_both_tiers() -> None:
    stack = TierStack(cpu_slots=2, ssd_slots=4)
    store(stack, [k(0)])
    store(stack, [k(1)])
    demote_all(stack)
    assert stack.clear() == 2
    assert stack.match([k(0)]) == 0 and stack.match([k(1)]) == 0


def test_a_chunk_being_promoted_is_not_offered_to_a_second_load() -> None:
    stack = TierStack(cpu_slots=4, ssd_slots=8)
    for i in (0, 1, 2, 3, 10, 11, 12, 13):  # pushes k(0..3) to SSD, one at a time
        store(stack, [k(i)])
        demote_all(stack)
    first = stack.acquire([k(0), k(1)])
    assert [s.tier for s in first] == [Tier.SSD, Tier.SSD]
    # while the first load promotes them, a second request sees no loadable prefix...
    assert stack.residence([k(0), k(1)]) == []
    assert stack.acquire([k(0), k(1)]) == []
    demote_all(stack)
    stack.release(first, ok=True, bad_keys=set())
    # ...and once promoted, it loads them from CPU
    assert stack.residence([k(0), k(1)]) == [Tier.CPU, Tier.CPU]


def test_clear_drops_copies_to_ssd_not_yet_sent() -> None:
    stack = TierStack(cpu_slots=2, ssd_slots=4, write_through=True)
    store(stack, [k(0), k(1)])  # write-through copies queued, CPU slots pinned
    stack.clear()
    assert stack.take_demotions().copies == ()
    assert pinned(stack) == (0, 0)
    assert stack.ssd is not None and stack.ssd.usage().free == 4


def on_ssd_only(stack: TierStack, n: int) -> list[ChunkKey]:
    """Store ``n`` chunks one at a time, written back as the CPU tier fills, then push them
    out of it with as many others: the first ``n`` are on SSD only."""
    for i in (*range(n), *range(100, 100 + n)):
        store(stack, [k(i)])
        demote_all(stack)
    keys = [k(i) for i in range(n)]
    assert all(key not in stack.cpu for key in keys) and stack.match(keys) == n
    return keys


def test_a_load_past_what_the_cpu_tier_spares_streams_through_the_staging_slots() -> None:
    stack = TierStack(cpu_slots=4, ssd_slots=32, max_writeback=1, stream_slots=2)
    keys = on_ssd_only(stack, 8)
    sources = stack.acquire(keys)
    assert len(sources) == 8  # not capped by the 4 CPU slots
    promoted = [s for s in sources if not s.streamed]
    assert len(promoted) == stack.max_load_chunks == 3
    assert [s.tier for s in sources] == [Tier.SSD] * 8
    # the staging slots come after the CPU tier's, in turn
    assert [s.cpu for s in sources if s.streamed] == [4, 5, 4, 5, 4]
    demote_all(stack)  # the write-ahead that making room for the promotions started
    assert pinned(stack) == (3, 8)
    stack.release(sources, ok=True, bad_keys={keys[5]})
    assert pinned(stack) == (0, 0)
    # promoted chunks are published in CPU; streamed ones are not, and a bad one is dropped
    assert [key in stack.cpu for key in keys] == [True] * 3 + [False] * 5
    assert stack.ssd is not None and keys[5] not in stack.ssd and keys[4] in stack.ssd


def test_a_streamed_load_never_sent_gives_every_pin_back() -> None:
    stack = TierStack(cpu_slots=4, ssd_slots=32, max_writeback=1, stream_slots=2)
    keys = on_ssd_only(stack, 6)
    stack.cancel(stack.acquire(keys))
    demote_all(stack)
    assert pinned(stack) == (0, 0)
    assert stack.match(keys) == 6 and not any(key in stack.cpu for key in keys)


def test_without_staging_slots_a_load_ends_where_no_cpu_slot_is_free() -> None:
    stack = TierStack(cpu_slots=4, ssd_slots=32, max_writeback=1)
    keys = on_ssd_only(stack, 8)
    sources = stack.acquire(keys)
    assert 0 < len(sources) < 8 and not any(s.streamed for s in sources)
    stack.cancel(sources)
    demote_all(stack)
    assert pinned(stack) == (0, 0)


def test_a_load_that_must_stage_every_read_is_promised_only_the_slots_it_can_take() -> None:
    """Without staging slots every SSD read lands in a CPU slot: slots pinned by write-through
    copies still being written are not promised (the load would fail at acquire and come
    back as load errors); once written they are."""
    stack = TierStack(cpu_slots=4, ssd_slots=32, write_through=True)
    for i in (0, 1, 2, 100, 101, 102, 103):  # each written through, the first three pushed out
        store(stack, [k(i)])
        demote_all(stack)
    keys, run = [k(0), k(1), k(2)], [Tier.SSD] * 3
    assert stack.residence(keys) == run
    store(stack, [k(50), k(51), k(52), k(53)])  # write-through: all four slots pinned
    assert stack.staged_prefix(run) == 0
    demote_all(stack)
    sources = stack.acquire(keys)
    assert len(sources) == 3
    assert stack.staged_prefix(run) == 1  # the promotions hold three of the four slots
    stack.cancel(sources)
    # 4 slots, two of them the load's own CPU chunks: two reads fit
    assert stack.staged_prefix([Tier.CPU, *run, Tier.CPU]) == 3
