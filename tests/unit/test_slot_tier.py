"""SlotTier: two-phase loads and stores, pinning against eviction, and slot reuse."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from miniflex.tiers import SlotTier
from miniflex.types import ChunkKey, Tier


def keys(*ids: int) -> list[ChunkKey]:
    return [ChunkKey((i << 64) | (i * 7919)) for i in ids]


def test_store_is_invisible_until_committed() -> None:
    tier = SlotTier(Tier.CPU, 4)
    placed = tier.prepare_store(keys(1, 2))
    assert [k for k, _ in placed] == keys(1, 2)
    assert tier.match(keys(1, 2)) == 0 and tier.is_storing(keys(1)[0])
    assert tier.prepare_store(keys(1, 2)) == []  # a store in flight is not started twice
    tier.complete_store(placed, ok=True)
    assert tier.match(keys(1, 2, 3)) == 2


def test_failed_store_frees_its_slots() -> None:
    tier = SlotTier(Tier.CPU, 2)
    tier.complete_store(tier.prepare_store(keys(1, 2)), ok=False)
    assert tier.match(keys(1)) == 0
    assert tier.usage().free == 2
    assert len(tier.prepare_store(keys(3, 4))) == 2


def test_eviction_takes_a_prefix_from_its_tail_so_its_head_still_hits() -> None:
    tier = SlotTier(Tier.CPU, 6)
    a = keys(1, 2, 3, 4)
    tier.complete_store(tier.prepare_store(a), ok=True)
    tier.complete_store(tier.prepare_store(keys(9, 10)), ok=True)
    tier.complete_store(tier.prepare_store(keys(11, 12)), ok=True)  # room for two: a's tail
    assert tier.match(a) == 2 and a[2] not in tier and a[3] not in tier


def test_a_loaded_prefix_is_kept_head_first_too() -> None:
    tier = SlotTier(Tier.CPU, 4)
    a = keys(1, 2, 3)
    tier.complete_store(tier.prepare_store(keys(9)), ok=True)
    tier.complete_store(tier.prepare_store(a), ok=True)
    tier.complete_load(tier.prepare_load(a), ok=True)  # a is used again: 9 is now oldest
    tier.complete_store(tier.prepare_store(keys(10, 11)), ok=True)
    assert tier.match(a) == 2 and keys(9)[0] not in tier  # 9 first, then a's last chunk


def test_touching_a_prefix_keeps_it_over_older_ones() -> None:
    tier = SlotTier(Tier.CPU, 4)
    a, b = keys(1, 2), keys(3, 4)
    tier.complete_store(tier.prepare_store(a), ok=True)
    tier.complete_store(tier.prepare_store(b), ok=True)
    tier.touch([*a, *keys(99)])  # a request with prefix a (and more, not resident) admitted
    tier.complete_store(tier.prepare_store(keys(5)), ok=True)
    assert tier.match(a) == 2 and tier.match(b) == 1  # b's tail went, not a's


def test_lru_evicts_oldest_unpinned_chunk() -> None:
    tier = SlotTier(Tier.CPU, 2)
    tier.complete_store(tier.prepare_store(keys(1)), ok=True)
    tier.complete_store(tier.prepare_store(keys(2)), ok=True)
    tier.complete_load(tier.prepare_load(keys(1)), ok=True)  # 1 is now most recent
    tier.complete_store(tier.prepare_store(keys(3)), ok=True)
    assert keys(1)[0] in tier and keys(2)[0] not in tier and keys(3)[0] in tier
    assert tier.usage().evictions == 1


def test_chunks_being_loaded_are_never_evicted() -> None:
    tier = SlotTier(Tier.CPU, 2)
    tier.complete_store(tier.prepare_store(keys(1, 2)), ok=True)
    loading = tier.prepare_load(keys(1, 2))
    assert tier.prepare_store(keys(3)) == []  # everything pinned: the store is skipped
    tier.complete_load(loading, ok=True)
    assert len(tier.prepare_store(keys(3))) == 1


def test_extending_a_prefix_does_not_evict_the_prefix() -> None:
    tier = SlotTier(Tier.CPU, 3)
    tier.complete_store(tier.prepare_store(keys(1)), ok=True)
    tier.complete_store(tier.prepare_store(keys(9)), ok=True)
    tier.complete_store(tier.prepare_store(keys(1, 2, 3)), ok=True)  # needs 2 slots, has 1 free
    assert tier.match(keys(1, 2, 3)) == 3 and keys(9)[0] not in tier


def test_failed_load_drops_the_chunk_after_the_last_reader() -> None:
    tier = SlotTier(Tier.CPU, 2)
    tier.complete_store(tier.prepare_store(keys(1)), ok=True)
    a, b = tier.prepare_load(keys(1)), tier.prepare_load(keys(1))
    tier.complete_load(a, ok=False)
    assert tier.match(keys(1)) == 0  # unpublished at once
    assert tier.usage().free == 1  # but the slot is still in use by reader b
    tier.complete_load(b, ok=True)
    assert tier.usage().free == 2


def test_clear_drops_everything_and_frees_slots_once_unpinned() -> None:
    tier = SlotTier(Tier.CPU, 3)
    tier.complete_store(tier.prepare_store(keys(1, 2)), ok=True)
    loading = tier.prepare_load(keys(1))
    storing = tier.prepare_store(keys(3))
    assert tier.clear() == 2
    assert tier.match(keys(1)) == 0 and tier.match(keys(2)) == 0
    assert tier.usage().free == 1  # 2 freed; 1 still read by a load, 3 being stored
    tier.complete_load(loading, ok=True)
    tier.complete_store(storing, ok=True)  # started before the reset: never published
    assert tier.match(keys(3)) == 0 and tier.usage().free == 3
    tier.complete_store(tier.prepare_store(keys(3)), ok=True)  # a new store does
    assert tier.match(keys(3)) == 1


def test_prepare_load_stops_at_first_missing_key() -> None:
    tier = SlotTier(Tier.CPU, 4)
    tier.complete_store(tier.prepare_store(keys(1, 2)), ok=True)
    assert len(tier.prepare_load(keys(1, 5, 2))) == 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["store", "fail", "load", "drop"]),
            st.lists(st.integers(1, 12), min_size=1, max_size=4),
        ),
        max_size=40,
    )
)
def test_slots_are_never_shared_or_lost(ops: list[tuple[str, list[int]]]) -> None:
    """Whatever happens, resident + free slots account for every slot exactly once."""
    tier = SlotTier(Tier.CPU, 5)
    for op, ids in ops:
        ks = keys(*ids)
        if op in ("store", "fail"):
            tier.complete_store(tier.prepare_store(ks), ok=op == "store")
        elif op == "load":
            tier.complete_load(tier.prepare_load(ks), ok=True)
        else:
            tier.drop(ks[0])
        slots = [tier.slot_of(k) for k in keys(*range(1, 13)) if k in tier]
        assert len(set(slots)) == len(slots)
        usage = tier.usage()
        assert usage.resident + usage.free == 5 and usage.pinned_or_moving == 0
        assert all(isinstance(s, int) and 0 <= s < 5 for s in slots if s is not None)


def test_generated_tokens_go_first_and_never_push_out_a_prompt() -> None:
    tier = SlotTier(Tier.CPU, 4)
    prompt, output = keys(1, 2), keys(3)
    tier.complete_store(tier.prepare_store([*prompt, *output], cold_from=2), ok=True)
    other = keys(7)
    tier.complete_store(tier.prepare_store(other), ok=True)  # the last free slot
    tier.complete_store(tier.prepare_store(keys(8)), ok=True)  # evicts the output chunk
    assert tier.match(prompt) == 2 and output[0] not in tier and other[0] in tier
    # a cold chunk a later request uses is kept like any other
    tier.complete_store(tier.prepare_store(keys(20), cold_from=0), ok=True)
    tier.touch(keys(20))
    tier.complete_store(tier.prepare_store(keys(21)), ok=True)
    assert keys(20)[0] in tier and prompt[1] not in tier  # the oldest prompt's tail went
