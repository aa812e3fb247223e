"""Write-back under pressure: when a store waits for a write to SSD and when it drops a
chunk unwritten, from the write's predicted end and whether the disk keeps up."""

from __future__ import annotations

from miniflex.plan import SlotCopy
from miniflex.tiers import TierStack
from miniflex.tiers.stack import WRITE_WAIT_S
from miniflex.tiers.writeback import FixedCosts
from tests.unit.test_tier_stack import k, store


def full_over_a_slow_disk(now: list[float], cpu_slots: int, max_writeback: int) -> TierStack:
    """A CPU tier filled one chunk at a time, k(0) first, over a disk that writes a chunk a
    second; the last ``max_writeback`` stores started write-backs, not sent yet."""
    stack = TierStack(
        cpu_slots=cpu_slots,
        ssd_slots=2 * cpu_slots,
        max_writeback=max_writeback,
        clock=lambda: now[0],
    )
    stack.observe_writes(chunks=2, seconds=2.0)
    for i in range(cpu_slots):
        store(stack, [k(i)])
    return stack


def test_past_max_writeback_a_store_waits_only_for_a_write_predicted_to_end_soon() -> None:
    now = [0.0]
    stack = full_over_a_slow_disk(now, cpu_slots=4, max_writeback=1)  # k(0) is being written
    (copy,) = stack.take_demotions().copies  # sent at t=0: predicted to end at t=1
    store(stack, [k(4)])  # k(0)'s write is a second away: k(1) is evicted unwritten
    assert (
        stack.writeback.take_skipped_demotions() == 1
        and stack.writeback.take_skipped_demotions() == 0
    )
    assert stack.match([k(1)]) == 0 and k(0) in stack.cpu
    now[0] = 1.0 - WRITE_WAIT_S / 2  # the write should be about done: its slot is taken
    store(stack, [k(5)])
    assert stack.writeback.take_skipped_demotions() == 0
    assert k(0) not in stack.cpu and k(5) in stack.cpu
    assert [c.key for c in stack.take_demotions().copies] == [k(2)]  # written ahead, as always
    stack.complete_demotions([copy], set())  # k(0) reaches SSD; its old slot is k(5)'s
    assert stack.match([k(0)]) == 1 and k(5) in stack.cpu


def test_every_write_back_of_a_job_is_predicted_to_end_with_the_whole_job() -> None:
    # A worker knows a slot is written only when its whole DEMOTE job is: the first chunk's
    # slot is no sooner free than the last one's.
    now = [0.0]
    stack = full_over_a_slow_disk(now, cpu_slots=6, max_writeback=2)  # k(0), k(1) being written
    copies = stack.take_demotions().copies  # one job of two chunks, sent at t=0: done at t=2
    assert [c.key for c in copies] == [k(0), k(1)]
    now[0] = 1.0  # k(0) alone would be written by now, but its job is not
    store(stack, [k(6)])
    assert (
        k(0) in stack.cpu and stack.writeback.take_skipped_demotions() == 1
    )  # k(2) went unwritten
    now[0] = 2.0 - WRITE_WAIT_S / 2
    store(stack, [k(7)])  # the job should be about done: k(0)'s slot is taken
    assert stack.writeback.take_skipped_demotions() == 0 and stack.writeback.landing(k(0))


def test_past_max_writeback_a_disk_that_keeps_up_is_always_waited_for() -> None:
    stack = TierStack(
        cpu_slots=4,
        ssd_slots=8,
        max_writeback=1,
        clock=lambda: 0.0,
        costs=FixedCosts(recompute=0.03),
    )
    stack.observe_writes(chunks=4, seconds=4 * 0.01)  # a chunk in a third of its recompute
    assert stack.disk_keeps_up
    for i in range(4):
        store(stack, [k(i)])  # the last one starts k(0)'s write-back, not sent yet
    store(stack, [k(4)])  # the backlog is full: k(4) takes k(0)'s slot, k(1) is not dropped
    assert stack.writeback.take_skipped_demotions() == 0 and stack.writeback.landing(k(0))
    assert stack.match([k(1), k(2), k(3), k(4)]) == 4
    copies = stack.take_demotions().copies
    assert [c.key for c in copies][:1] == [k(0)]  # its write goes out before the store
    stack.complete_demotions(copies, set())
    assert stack.match([k(0)]) == 1


def test_a_reclaimed_chunk_is_landing_until_its_write_is_reported() -> None:
    now = [0.0]
    stack = TierStack(cpu_slots=4, ssd_slots=8, max_writeback=1, clock=lambda: now[0])
    for i in range(4):
        store(stack, [k(i)])  # k(0) is being written back
    (copy,) = stack.take_demotions().copies  # no write speed seen: predicted done at once
    assert not stack.writeback.landing(k(0))  # still served from CPU
    store(stack, [k(4)])  # takes k(0)'s slot
    assert stack.writeback.landing(k(0)) and stack.match([k(0)]) == 0  # readable nowhere for now
    stack.complete_demotions([copy], set())
    assert not stack.writeback.landing(k(0)) and stack.match([k(0)]) == 1


def _all_but_one_slot_pinned(write_s: float, recompute_s: float) -> tuple[TierStack, SlotCopy]:
    """A 4-slot CPU tier: k(0) being written back (sent), k(1)-k(3) being read."""
    stack = TierStack(
        cpu_slots=4,
        ssd_slots=8,
        max_writeback=1,
        clock=lambda: 0.0,
        costs=FixedCosts(recompute=recompute_s),
    )
    stack.observe_writes(chunks=1, seconds=write_s)
    for i in range(4):
        store(stack, [k(i)])
    (copy,) = stack.take_demotions().copies
    stack.acquire([k(1), k(2), k(3)])
    return stack, copy


def test_with_every_other_slot_pinned_a_store_waits_for_a_disk_that_keeps_up() -> None:
    stack, copy = _all_but_one_slot_pinned(write_s=0.01, recompute_s=0.03)
    placed = stack.prepare_store([k(4)])  # nothing to evict: k(0)'s slot, its write or not
    assert placed == [(k(4), copy.cpu)] and stack.writeback.landing(k(0))
    assert stack.writeback.take_skipped_demotions() == 0
    stack.complete_store(placed, ok=True)
    stack.complete_demotions([copy], set())
    assert stack.match([k(0)]) == 1 and k(4) in stack.cpu


def test_with_every_other_slot_pinned_a_store_does_not_wait_for_a_slow_disk() -> None:
    stack, copy = _all_but_one_slot_pinned(write_s=10.0, recompute_s=0.03)
    assert not stack.disk_keeps_up
    assert stack.prepare_store([k(4)]) == []  # the write ends in 10 s: not worth it
    assert not stack.writeback.landing(k(0)) and k(0) in stack.cpu
    stack.complete_demotions([copy], set())
    assert stack.prepare_store([k(4)]) != []  # written: its slot is free


def test_back_to_back_stores_take_slots_of_writes_not_sent_yet_rather_than_lose_chunks() -> None:
    # A server's next prompt is scheduled while the previous one's store is in flight: its
    # chunks are pinned, and the chunks evicted for room have not been sent to the disk yet.
    stack = TierStack(cpu_slots=4, ssd_slots=8, max_writeback=2, costs=FixedCosts(recompute=0.03))
    stack.observe_writes(chunks=1, seconds=0.001)  # a disk that keeps up
    store(stack, [k(0), k(1)])
    in_flight = stack.prepare_store([k(2), k(3)])  # the previous prompt, still storing
    placed = stack.prepare_store([k(4), k(5)])  # k(0), k(1): evicted, writes not sent
    assert [key for key, _ in placed] == [k(4), k(5)]
    assert (
        stack.writeback.take_skipped_demotions() == 0
        and stack.writeback.landing(k(0))
        and stack.writeback.landing(k(1))
    )
    copies = stack.take_demotions().copies  # sent in the plan, ahead of the store into their slots
    # the older prefix goes tail first: k(1)'s slot to k(4), then k(0)'s to k(5)
    assert {(c.key, c.cpu) for c in copies} == {(k(1), placed[0][1]), (k(0), placed[1][1])}
    stack.complete_store(in_flight, ok=True)
    stack.complete_store(placed, ok=True)
    stack.complete_demotions(copies, set())
    assert stack.match([k(0), k(1), k(2), k(3), k(4), k(5)]) == 6  # nothing lost
