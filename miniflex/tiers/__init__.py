"""Scheduler-side tier bookkeeping: slot allocators, indexes and eviction, no bytes."""

from miniflex.tiers.slot_tier import SlotTier, TierUsage
from miniflex.tiers.stack import ChunkSource, TierStack

__all__ = ["ChunkSource", "SlotTier", "TierStack", "TierUsage"]
