"""Scenarios for the eviction policies, checked against an OrderedDict + pin-count model."""

from __future__ import annotations

from collections import OrderedDict
from typing import ClassVar

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from miniflex.index import (
    POLICIES,
    EvictionPolicy,
    FIFOPolicy,
    LRUPolicy,
    make_policy,
)
from miniflex.types import SlotId


class PolicyModel:
    """The obvious implementation: candidates in an OrderedDict, oldest first."""

    def __init__(self, num_slots: int, move_on_touch: bool) -> None:
        self.move_on_touch = move_on_touch
        self.resident: set[int] = set()
        self.pins = [0] * num_slots
        self.queue: OrderedDict[int, None] = OrderedDict()  # resident and unpinned
        self.cold: set[int] = set()  # resident, at the front until touched

    def _enqueue(self, s: int) -> None:
        self.queue[s] = None
        if s in self.cold:
            self.queue.move_to_end(s, last=False)

    def touch(self, s: int) -> None:
        was_cold = s in self.cold
        self.cold.discard(s)
        if s not in self.resident:
            self.resident.add(s)
            if self.pins[s] == 0:
                self.queue[s] = None
        elif self.pins[s] == 0 and (self.move_on_touch or was_cold):
            self.queue.move_to_end(s)

    def touch_cold(self, s: int) -> None:
        if s in self.resident:
            return
        self.resident.add(s)
        self.cold.add(s)
        if self.pins[s] == 0:
            self._enqueue(s)

    def remove(self, s: int) -> None:
        self.resident.discard(s)
        self.cold.discard(s)
        self.queue.pop(s, None)

    def pin(self, s: int) -> None:
        self.pins[s] += 1
        self.queue.pop(s, None)

    def unpin(self, s: int) -> None:
        self.pins[s] -= 1
        if self.pins[s] == 0 and s in self.resident:
            self._enqueue(s)

    def evict(self) -> int | None:
        if not self.queue:
            return None
        s, _ = self.queue.popitem(last=False)
        self.resident.remove(s)
        self.cold.discard(s)
        return s


slot_draw = st.integers(0, 63)


class PolicyVsModel(RuleBasedStateMachine):
    """Random touch/remove/pin/unpin/evict sequences; evict must pick exactly the model's victim."""

    policy_name: ClassVar[str]
    move_on_touch: ClassVar[bool]

    @initialize(num_slots=st.sampled_from([0, 1, 2, 3, 5, 8]))
    def make_policy(self, num_slots: int) -> None:
        self.n = num_slots
        self.policy = make_policy(self.policy_name, num_slots)
        self.model = PolicyModel(num_slots, self.move_on_touch)

    def slot(self, drawn: int) -> SlotId:
        return SlotId(drawn % self.n)

    @precondition(lambda self: self.n > 0)
    @rule(drawn=slot_draw)
    def touch(self, drawn: int) -> None:
        self.policy.touch(self.slot(drawn))
        self.model.touch(self.slot(drawn))

    @precondition(lambda self: self.n > 0)
    @rule(drawn=slot_draw)
    def touch_cold(self, drawn: int) -> None:
        self.policy.touch_cold(self.slot(drawn))
        self.model.touch_cold(self.slot(drawn))

    @precondition(lambda self: self.n > 0)
    @rule(drawn=slot_draw)
    def remove(self, drawn: int) -> None:
        self.policy.remove(self.slot(drawn))
        self.model.remove(self.slot(drawn))

    @precondition(lambda self: self.n > 0)
    @rule(drawn=slot_draw)
    def pin(self, drawn: int) -> None:
        self.policy.pin(self.slot(drawn))
        self.model.pin(self.slot(drawn))

    @precondition(lambda self: self.n > 0)
    @rule(drawn=slot_draw)
    def unpin(self, drawn: int) -> None:
        s = self.slot(drawn)
        if self.model.pins[s] == 0:
            with pytest.raises(AssertionError):
                self.policy.unpin(s)
        else:
            self.policy.unpin(s)
            self.model.unpin(s)

    @rule()
    def evict(self) -> None:
        victim = self.policy.evict()
        assert victim == self.model.evict()
        if victim is not None:
            assert not self.policy.is_pinned(victim)
            assert victim not in self.policy

    @rule()
    def evict_until_empty(self) -> None:
        while (victim := self.model.evict()) is not None:
            assert self.policy.evict() == victim
        assert self.policy.evict() is None
        # Whatever is still resident is pinned.
        assert all(self.policy.is_pinned(SlotId(s)) for s in self.model.resident)

    @invariant()
    def residency_and_pins_match(self) -> None:
        if not hasattr(self, "policy"):
            return
        assert len(self.policy) == len(self.model.resident)
        for s in range(self.n):
            assert (s in self.policy) is (s in self.model.resident)
            assert self.policy.is_pinned(SlotId(s)) is (self.model.pins[s] > 0)
        assert self.policy.num_pinned() == sum(1 for s in range(self.n) if self.model.pins[s] > 0)


class LRUVsModel(PolicyVsModel):
    policy_name = "lru"
    move_on_touch = True


class FIFOVsModel(PolicyVsModel):
    policy_name = "fifo"
    move_on_touch = False


_machine_settings = settings(max_examples=300, stateful_step_count=50, deadline=None)
LRUVsModel.TestCase.settings = _machine_settings
FIFOVsModel.TestCase.settings = _machine_settings
TestLRUVsModel = LRUVsModel.TestCase
TestFIFOVsModel = FIFOVsModel.TestCase


# ---------------------------------------------------------------- scenarios


def touched(policy: EvictionPolicy, *slots: int) -> EvictionPolicy:
    for s in slots:
        policy.touch(SlotId(s))
    return policy


def drain(policy: EvictionPolicy) -> list[int]:
    out = []
    while (s := policy.evict()) is not None:
        out.append(s)
    return out


def test_lru_evicts_the_least_recently_touched_slot() -> None:
    lru = touched(LRUPolicy(4), 0, 1, 2, 0)
    assert drain(lru) == [1, 2, 0]


def test_fifo_ignores_re_touching_a_resident_slot() -> None:
    fifo = touched(FIFOPolicy(4), 0, 1, 2, 0)
    assert drain(fifo) == [0, 1, 2]


@pytest.mark.parametrize("cls", [LRUPolicy, FIFOPolicy])
def test_pinned_slots_are_never_evicted(cls: type[LRUPolicy]) -> None:
    policy = touched(cls(4), 0, 1, 2)
    policy.pin(SlotId(0))
    policy.pin(SlotId(0))
    assert drain(policy) == [1, 2]
    assert policy.evict() is None  # everything left is pinned
    assert len(policy) == 1 and 0 in policy
    policy.unpin(SlotId(0))
    assert policy.evict() is None  # still pinned once
    policy.unpin(SlotId(0))
    assert policy.evict() == 0
    assert len(policy) == 0


@pytest.mark.parametrize("cls", [LRUPolicy, FIFOPolicy])
def test_evict_on_an_empty_policy_returns_none(cls: type[LRUPolicy]) -> None:
    assert cls(3).evict() is None
    assert cls(0).evict() is None


@pytest.mark.parametrize("cls", [LRUPolicy, FIFOPolicy])
def test_unpinned_slot_rejoins_at_the_most_recent_end(cls: type[LRUPolicy]) -> None:
    policy = touched(cls(3), 0, 1, 2)
    policy.pin(SlotId(0))
    policy.touch(SlotId(0))  # pinned: stays pinned
    assert policy.is_pinned(SlotId(0))
    policy.unpin(SlotId(0))
    assert drain(policy) == [1, 2, 0]


def test_slot_pinned_before_it_is_touched_becomes_evictable_after_unpin() -> None:
    lru = LRUPolicy(2)
    lru.pin(SlotId(1))  # reserved while its data is written
    lru.touch(SlotId(1))
    assert lru.evict() is None
    lru.unpin(SlotId(1))
    assert lru.evict() == 1


def test_removed_slot_is_forgotten_and_remove_of_absent_slot_is_a_no_op() -> None:
    lru = touched(LRUPolicy(3), 0, 1)
    lru.remove(SlotId(0))
    lru.remove(SlotId(0))
    lru.remove(SlotId(2))
    assert len(lru) == 1 and 0 not in lru
    assert drain(lru) == [1]


def test_unbalanced_unpin_is_an_assertion_error() -> None:
    lru = touched(LRUPolicy(2), 0)
    with pytest.raises(AssertionError, match="not pinned"):
        lru.unpin(SlotId(0))
    assert lru.evict() == 0


def test_out_of_range_slots_are_rejected() -> None:
    lru = LRUPolicy(2)
    for op in (lru.touch, lru.remove, lru.pin, lru.unpin, lru.is_pinned):
        with pytest.raises(IndexError):
            op(SlotId(2))
        with pytest.raises(IndexError):
            op(SlotId(-1))
    assert 2 not in lru and -1 not in lru and "x" not in lru
    lru.touch(np.int64(1))  # type: ignore[arg-type]
    assert lru.evict() == 1


def test_make_policy_builds_registered_policies() -> None:
    assert set(POLICIES) == {"lru", "fifo"}
    assert type(make_policy("lru", 4)) is LRUPolicy
    assert type(make_policy("FIFO", 4)) is FIFOPolicy
    assert make_policy("lru", 4).num_slots == 4
    with pytest.raises(TypeError):
        POLICIES["mru"] = LRUPolicy  # type: ignore[index]


def test_unknown_policy_name_error_lists_the_valid_names() -> None:
    with pytest.raises(ValueError, match=r"unknown eviction policy 'arc'.*'fifo', 'lru'"):
        make_policy("arc", 4)
    with pytest.raises(ValueError):
        make_policy("lru", -1)


@pytest.mark.parametrize("cls", [LRUPolicy, FIFOPolicy])
def test_a_cold_slot_is_evicted_first_until_it_is_used(cls: type[LRUPolicy]) -> None:
    p = touched(cls(5), 0, 1)
    p.touch_cold(SlotId(2))
    p.touch_cold(SlotId(3))
    p.pin(SlotId(3))
    p.unpin(SlotId(3))  # unpinned (its store done), a cold slot goes back to the front
    p.touch_cold(SlotId(0))  # already resident and used: stays where it is
    p.touch(SlotId(2))  # used by a request: now the most recent
    assert drain(p) == [3, 0, 1, 2]
