"""Per-tier hit accounting (``scheduler/hits.py``): how a load's tokens split by tier, as
vLLM 0.32+ asks (get_external_cache_hit_sources)."""

from __future__ import annotations

from miniflex.connector import compat
from miniflex.scheduler.requests import PendingLoad, load_tokens_by_tier
from miniflex.tiers import ChunkSource
from miniflex.types import ChunkKey, SlotId, Tier

CT = 32  # tokens per chunk


def load(first: int, num: int, tiers: list[Tier]) -> PendingLoad:
    sources = [
        ChunkSource(ChunkKey(i), SlotId(i), SlotId(i) if t is Tier.SSD else None)
        for i, t in enumerate(tiers)
    ]
    return PendingLoad(first, num, sources)


def test_a_load_from_a_chunk_boundary_counts_whole_chunks_per_tier() -> None:
    assert load_tokens_by_tier(load(0, 96, [Tier.CPU, Tier.SSD, Tier.SSD]), 96, CT) == {
        Tier.CPU: 32,
        Tier.SSD: 64,
    }


def test_a_load_starting_inside_a_chunk_counts_only_the_tokens_it_loads() -> None:
    # vLLM's own hit ends at token 16, inside chunk 0: the load covers tokens 16-95
    split = load_tokens_by_tier(load(16, 80, [Tier.CPU, Tier.SSD, Tier.CPU]), 80, CT)
    assert split == {Tier.CPU: 16 + 32, Tier.SSD: 32}


def test_tokens_no_tier_holds_any_more_count_as_unknown_and_the_sum_is_kept() -> None:
    # two chunks promised, one still resident when the load pinned its chunks
    assert load_tokens_by_tier(load(0, 64, [Tier.CPU]), 64, CT) == {Tier.CPU: 32, None: 32}
    assert load_tokens_by_tier(None, 48, CT) == {None: 48}
    assert load_tokens_by_tier(None, 0, CT) == {}


def test_vllm_sources_are_host_for_cpu_and_disk_for_ssd() -> None:
    sources = compat.cache_hit_sources({Tier.CPU: 32, Tier.SSD: 64, None: 16})
    assert sources == {"host": 32, "disk": 64, "external_unspecified": 16}
    assert compat.cache_hit_sources({Tier.CPU: 0}) == {}  # vLLM wants non-zero counts only
    assert all(type(s) is type(compat.hit_source("host")) for s in sources)
