"""SlotTier with a Keeper: evicted chunks kept readable while written elsewhere, and reclaimed."""

from __future__ import annotations

from miniflex.tiers import SlotTier
from miniflex.types import ChunkKey, SlotId, Tier


def keys(*ids: int) -> list[ChunkKey]:
    return [ChunkKey((i << 64) | (i * 7919)) for i in ids]


class KeepAll:
    """Keeps every victim (as a write-back would) and reclaims one kept slot when told to."""

    def __init__(self, reclaims: bool = False) -> None:
        self.kept: list[tuple[ChunkKey, SlotId]] = []
        self.reclaims = reclaims
        self.asked: list[bool] = []

    def keep(self, key: ChunkKey, slot: SlotId) -> bool:
        self.kept.append((key, slot))
        return True

    def reclaim(self, tier: SlotTier, force: bool) -> bool:
        self.asked.append(force)
        if not (self.reclaims and self.kept):
            return False
        _, slot = self.kept.pop(0)
        return tier.release_kept(slot)


def full_tier(n: int) -> SlotTier:
    tier = SlotTier(Tier.CPU, n)
    tier.complete_store(tier.prepare_store(keys(*range(1, n + 1))), ok=True)
    return tier


def test_a_kept_victim_stays_readable_until_its_eviction_finishes() -> None:
    tier, keeper = full_tier(2), KeepAll()
    assert tier.evict_one(keeper)
    (key, slot) = keeper.kept[0]
    assert key in tier and tier.free_slots == 0  # kept: still served, its slot pinned
    assert tier.prepare_store(keys(9), keeper=keeper) == []  # nothing left to evict
    tier.finish_eviction(slot)
    assert key not in tier and tier.free_slots == 1
    assert [k for k, _ in tier.prepare_store(keys(9), keeper=keeper)] == keys(9)


def test_a_keeper_that_frees_a_kept_slot_gives_it_to_the_chunk_being_placed() -> None:
    tier, keeper = full_tier(2), KeepAll(reclaims=True)
    placed = tier.prepare_store(keys(9), keeper=keeper)
    assert [k for k, _ in placed] == keys(9)
    assert keeper.asked[0] is False  # asked before each victim, unforced first
    assert len(tier) == 1 and keeper.kept == []  # the reclaimed chunk is gone, the other stays


def test_without_a_keeper_a_victim_is_dropped_and_its_slot_reused_at_once() -> None:
    tier = full_tier(2)
    placed = tier.prepare_store(keys(9))
    assert [k for k, _ in placed] == keys(9)
    assert sum(k in tier for k in keys(1, 2)) == 1 and tier.usage().evictions == 1
