"""Scheduler-side tier bookkeeping: slot allocators, indexes and eviction, no bytes."""

from miniflex.tiers.hierarchy import ChunkSource, TierStack
from miniflex.tiers.slot_tier import SlotTier, TierUsage

__all__ = ["ChunkSource", "SlotTier", "TierStack", "TierUsage"]
