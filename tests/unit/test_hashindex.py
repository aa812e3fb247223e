"""Scenarios for `miniflex.index.HashIndex`, checked against a dict model."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
)

from miniflex.errors import TierFullError
from miniflex.index import HashIndex, keys_to_array, split_key
from miniflex.types import SlotId, Tier

WORD = 1 << 64
MAX_KEY = (1 << 128) - 1
EDGE_WORDS = [0, 1, 5, (1 << 63) - 1, 1 << 63, WORD - 1]

any_key = st.integers(0, MAX_KEY)
# Keys built from a few edge words: many share hi or lo, and many have equal
# hi ^ lo (i.e. the same hash), so they pile up in one probe chain.
edge_key = st.builds(
    lambda hi, lo: hi * WORD + lo, st.sampled_from(EDGE_WORDS), st.sampled_from(EDGE_WORDS)
)
small_key = st.integers(0, 64)
keys = st.one_of(any_key, edge_key, small_key)
tiers = st.sampled_from(list(Tier))
slots = st.integers(0, (1 << 63) - 1)


def model_prefix(model: dict[int, tuple[Tier, int]], seq: list[int]) -> int:
    for i, k in enumerate(seq):
        if k not in model:
            return i
    return len(seq)


class HashIndexVsDict(RuleBasedStateMachine):
    """HashIndex must always agree with a plain dict capped at max_entries.

    Random inserts, upserts, deletes (many, to force tombstone cleanup and
    growth) and single/batch queries.
    """

    inserted = Bundle("inserted")

    @initialize(max_entries=st.sampled_from([1, 2, 11, 12, 40, 150]))
    def make_index(self, max_entries: int) -> None:
        self.index = HashIndex(max_entries)
        self.model: dict[int, tuple[Tier, int]] = {}
        self.max_entries = max_entries
        self.capacities_seen = {self.index.capacity}

    def _insert(self, key: int, tier: Tier, slot: int) -> bool:
        if key not in self.model and len(self.model) >= self.max_entries:
            with pytest.raises(TierFullError, match=f"max_entries={self.max_entries}"):
                self.index.insert(key, tier, SlotId(slot))
            return False
        was_new = key not in self.model
        cap, tombs = self.index.capacity, self.index.tombstones
        assert self.index.insert(key, tier, SlotId(slot)) is was_new
        self.model[key] = (tier, slot)
        self.capacities_seen.add(self.index.capacity)
        if self.index.capacity > cap:
            event("table grew")
        elif tombs > 1 and self.index.tombstones == 0:
            event("tombstones cleaned by an in-place rehash")
        return True

    @rule(target=inserted, key=keys, tier=tiers, slot=slots)
    def insert_one(self, key: int, tier: Tier, slot: int) -> object:
        return key if self._insert(key, tier, slot) else multiple()

    @rule(key=inserted, tier=tiers, slot=slots)
    def upsert_known_key(self, key: int, tier: Tier, slot: int) -> None:
        self._insert(key, tier, slot)

    @rule(target=inserted, batch=st.lists(keys, min_size=1, max_size=40), slot=slots)
    def insert_burst(self, batch: list[int], slot: int) -> object:
        added = [
            k for i, k in enumerate(batch) if self._insert(k, Tier.SSD, (slot + i) % (1 << 63))
        ]
        return multiple(*added)

    @rule(batch=st.lists(any_key, min_size=1, max_size=60, unique=True), tier=tiers)
    def churn(self, batch: list[int], tier: Tier) -> None:
        """Cache-like churn: short-lived keys come and go, leaving tombstones behind."""
        fresh = [k for k in batch if k not in self.model]
        for i, k in enumerate(fresh):
            self._insert(k, tier, i)
            if i % 3 == 2:
                for old in fresh[i - 2 : i + 1]:
                    assert self.index.delete(old) is (self.model.pop(old, None) is not None)

    @rule(key=st.one_of(inserted, keys))
    def delete_one(self, key: int) -> None:
        assert self.index.delete(key) is (self.model.pop(key, None) is not None)

    @rule(residue=st.integers(0, 3))
    def delete_three_quarters(self, residue: int) -> None:
        for key in [k for k in self.model if k % 4 != residue]:
            assert self.index.delete(key)
            del self.model[key]

    @rule(key=st.one_of(inserted, keys))
    def lookup_one(self, key: int) -> None:
        expected = self.model.get(key)
        got = self.index.lookup(key)
        assert got == expected
        assert (key in self.index) is (expected is not None)
        if got is not None:
            assert type(got[0]) is Tier

    @rule(
        present=st.lists(inserted, max_size=30),
        tail=st.lists(st.one_of(inserted, keys), max_size=10),
    )
    def prefix_match(self, present: list[int], tail: list[int]) -> None:
        seq = present + tail
        assert self.index.prefix_match(keys_to_array(seq)) == model_prefix(self.model, seq)

    @rule(seq=st.lists(st.one_of(inserted, keys), max_size=30))
    def lookup_many(self, seq: list[int]) -> None:
        found, slot = self.index.lookup_many(keys_to_array(seq))
        assert found.dtype == np.bool_ and found.shape == (len(seq),)
        assert slot.dtype == np.int64 and slot.shape == (len(seq),)
        for i, key in enumerate(seq):
            assert bool(found[i]) is (key in self.model)
            if found[i]:
                assert int(slot[i]) == self.model[key][1]
        assert self.index.contains_many(keys_to_array(seq)).tolist() == found.tolist()

    @rule()
    def clear(self) -> None:
        self.index.clear()
        self.model.clear()

    @invariant()
    def sizes_and_load_are_sane(self) -> None:
        idx = self.index
        cap = idx.capacity
        assert len(idx) == len(self.model) <= self.max_entries
        assert cap >= 16 and cap & (cap - 1) == 0
        assert idx.tombstones >= 0
        assert len(idx) + idx.tombstones <= 0.75 * cap
        # The public tombstone counter matches the table itself.
        assert idx.tombstones == int(np.count_nonzero(idx._state == 2))

    @invariant()
    def contents_match_model(self) -> None:
        got = {k: (t, s) for k, t, s in self.index.items()}
        assert got == self.model

    @invariant()
    def capacity_is_bounded_by_max_entries(self) -> None:
        # Never more than the smallest power of two holding max_entries at <= 5/8 load.
        cap = max(self.capacities_seen)
        assert cap == 16 or cap < 16 * self.max_entries / 5


HashIndexVsDict.TestCase.settings = settings(
    max_examples=200, stateful_step_count=60, deadline=None
)
TestHashIndexVsDict = HashIndexVsDict.TestCase


# ---------------------------------------------------------------- capacity cap


def test_full_index_rejects_a_new_key_but_updates_an_existing_one() -> None:
    index = HashIndex(max_entries=3)
    for k in (10, 20, 30):
        assert index.insert(k, Tier.CPU, SlotId(k))
    with pytest.raises(TierFullError, match="max_entries=3"):
        index.insert(40, Tier.CPU, SlotId(40))
    assert 40 not in index and len(index) == 3

    assert index.insert(20, Tier.SSD, SlotId(7)) is False
    assert index.lookup(20) == (Tier.SSD, 7)
    assert len(index) == 3


def test_delete_then_reinsert_at_the_cap() -> None:
    index = HashIndex(max_entries=2)
    index.insert(1, Tier.CPU, SlotId(0))
    index.insert(2, Tier.CPU, SlotId(1))
    assert index.delete(1)
    assert index.insert(3, Tier.SSD, SlotId(5))
    assert index.lookup(3) == (Tier.SSD, 5)
    assert index.lookup(1) is None
    with pytest.raises(TierFullError):
        index.insert(1, Tier.CPU, SlotId(0))


def test_growth_keeps_every_key_and_stays_under_load_limit() -> None:
    rng = random.Random(1)
    index = HashIndex(max_entries=5000)
    keys = [rng.getrandbits(128) for _ in range(5000)]
    for i, k in enumerate(keys):
        index.insert(k, Tier.CPU, SlotId(i))
    assert index.capacity >= 5000 / 0.7
    assert len(index) / index.capacity <= 0.7
    assert index.prefix_match(keys_to_array(keys)) == 5000
    with pytest.raises(TierFullError):
        index.insert(rng.getrandbits(128) | 1 << 127, Tier.CPU, SlotId(0))


def test_churn_with_few_live_keys_cleans_tombstones_instead_of_growing() -> None:
    index = HashIndex(max_entries=100_000)
    for k in range(5):
        index.insert(k, Tier.CPU, SlotId(k))
    for k in range(100, 3100):
        index.insert(k, Tier.CPU, SlotId(k))
        assert index.delete(k)
    assert index.capacity == 16
    assert len(index) == 5
    assert [index.lookup(k) for k in range(5)] == [(Tier.CPU, k) for k in range(5)]


def test_churn_at_the_cap_keeps_capacity_fixed_and_lookups_right() -> None:
    rng = random.Random(2)
    index = HashIndex(max_entries=1000)
    model = {}
    for i in range(1000):
        k = rng.getrandbits(128)
        index.insert(k, Tier.CPU, SlotId(i))
        model[k] = i
    cap = index.capacity
    for i in range(20_000):
        victim = rng.choice(list(model)) if i % 500 == 0 else next(iter(model))
        assert index.delete(victim)
        del model[victim]
        k = rng.getrandbits(128)
        index.insert(k, Tier.SSD, SlotId(i))
        model[k] = i
        assert len(index) + index.tombstones <= 0.7 * index.capacity
    assert index.capacity == cap
    found, slot = index.lookup_many(keys_to_array(list(model)))
    assert found.all() and slot.tolist() == list(model.values())


# ----------------------------------------------------------- colliding keys


def test_keys_with_the_same_low_word_are_distinct() -> None:
    index = HashIndex(max_entries=10)
    same_lo = [hi * WORD + 5 for hi in (0, 1, 2, WORD - 1)]
    for i, k in enumerate(same_lo):
        assert index.insert(k, Tier.CPU, SlotId(i))
    assert len(index) == 4
    assert [index.lookup(k) for k in same_lo] == [(Tier.CPU, i) for i in range(4)]
    assert index.delete(same_lo[1])
    assert index.lookup(same_lo[1]) is None
    assert index.lookup(same_lo[2]) == (Tier.CPU, 2)


def test_keys_differing_only_in_the_high_word_are_distinct() -> None:
    index = HashIndex(max_entries=10)
    a, b = 7, (1 << 127) + 7
    index.insert(a, Tier.CPU, SlotId(1))
    assert b not in index
    index.insert(b, Tier.SSD, SlotId(2))
    assert index.lookup(a) == (Tier.CPU, 1)
    assert index.lookup(b) == (Tier.SSD, 2)


def test_keys_with_identical_hash_share_a_probe_chain_correctly() -> None:
    # hi == lo for all of them, so hi ^ lo == 0: every key hashes to one bucket.
    index = HashIndex(max_entries=200)
    same_hash = [w * WORD + w for w in range(200)]
    for i, k in enumerate(same_hash):
        index.insert(k, Tier.CPU, SlotId(i))
    for k in same_hash[::2]:
        assert index.delete(k)
    assert index.prefix_match(keys_to_array(same_hash[1::2])) == 100
    assert index.prefix_match(keys_to_array(same_hash)) == 0
    assert [index.lookup(k) for k in same_hash[:4]] == [None, (Tier.CPU, 1), None, (Tier.CPU, 3)]


# ---------------------------------------------------------- batch queries


def test_prefix_match_on_an_empty_array_is_zero() -> None:
    index = HashIndex(max_entries=4)
    index.insert(1, Tier.CPU, SlotId(0))
    assert index.prefix_match(keys_to_array([])) == 0
    assert index.prefix_match(np.empty((0, 2), dtype=np.uint64)) == 0
    found, slot = index.lookup_many(keys_to_array([]))
    assert found.shape == (0,) and slot.shape == (0,)


def test_prefix_match_stops_at_the_first_miss() -> None:
    index = HashIndex(max_entries=10)
    for k in (1, 2, 3, 5):
        index.insert(k, Tier.CPU, SlotId(k))
    assert index.prefix_match(keys_to_array([1, 2, 3, 4, 5])) == 3
    assert index.prefix_match(keys_to_array([4, 1, 2])) == 0
    assert index.prefix_match(keys_to_array([3, 2, 1, 5])) == 4


def test_batch_queries_accept_non_contiguous_and_read_only_arrays() -> None:
    index = HashIndex(max_entries=10)
    for k in (1, 2, 3):
        index.insert(k, Tier.CPU, SlotId(k))
    arr = keys_to_array([1, 9, 2, 9, 3])
    assert index.prefix_match(arr[::2]) == 3
    arr.flags.writeable = False
    assert index.lookup_many(arr)[0].tolist() == [True, False, True, False, True]


def test_batch_queries_reject_arrays_of_the_wrong_shape_or_dtype() -> None:
    index = HashIndex(max_entries=4)
    with pytest.raises(ValueError, match="keys_to_array"):
        index.prefix_match(np.array([[1, 2]], dtype=np.int64))
    with pytest.raises(ValueError, match="shape"):
        index.lookup_many(np.zeros((3, 3), dtype=np.uint64))
    with pytest.raises(TypeError):
        index.prefix_match([1, 2, 3])  # type: ignore[arg-type]


# ------------------------------------------------------------- bad input


@pytest.mark.parametrize("bad", [-1, 1 << 128, -(1 << 200)])
def test_out_of_range_keys_raise_value_error_everywhere(bad: int) -> None:
    index = HashIndex(max_entries=4)
    with pytest.raises(ValueError, match=r"2\*\*128"):
        index.insert(bad, Tier.CPU, SlotId(0))
    with pytest.raises(ValueError):
        index.lookup(bad)
    with pytest.raises(ValueError):
        index.delete(bad)
    with pytest.raises(ValueError):
        bad in index  # noqa: B015
    with pytest.raises(ValueError, match="position 1"):
        keys_to_array([0, bad])
    with pytest.raises(ValueError):
        split_key(bad)
    assert len(index) == 0


def test_invalid_constructor_tier_and_slot_are_rejected() -> None:
    with pytest.raises(ValueError):
        HashIndex(0)
    index = HashIndex(max_entries=4)
    with pytest.raises(ValueError):
        index.insert(1, 7, SlotId(0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="slot"):
        index.insert(1, Tier.CPU, SlotId(-1))
    assert len(index) == 0
    assert index.insert(1, 2, SlotId(3))  # type: ignore[arg-type]
    assert index.lookup(1) == (Tier.SSD, 3)


def test_items_is_a_snapshot() -> None:
    index = HashIndex(max_entries=10)
    for k in range(5):
        index.insert(k, Tier.CPU, SlotId(k))
    it = index.items()
    index.delete(0)
    index.insert(9, Tier.SSD, SlotId(9))
    assert sorted(it) == [(k, Tier.CPU, k) for k in range(5)]


def test_compile_kernels_compiles_every_kernel_the_index_calls() -> None:
    # In a fresh process, so that no other test has compiled a kernel already.
    import re
    import subprocess
    import sys
    from pathlib import Path

    source = Path(__file__).parents[2] / "miniflex" / "index" / "hashindex.py"
    called = sorted(set(re.findall(r"self\._k\.([a-z_]+)\(", source.read_text())))
    assert {"insert", "delete", "lookup", "find", "rehash_into", "prefix_match"} <= set(called)
    probe = (
        "from miniflex.index import _kernels as k, compile_kernels\n"
        "compile_kernels()\n"
        f"print([n for n in {called!r} if not getattr(k, n).signatures])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
