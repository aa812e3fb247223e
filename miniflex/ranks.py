"""Tensor-parallel ranks: which rank holds which bytes, and each rank's share of the budgets.

One plan drives every rank of an engine (the scheduler's slot numbers are the
same on all of them), so what differs per rank is only whose bytes it moves:

* a *sharded* cache (every attention model but MLA): each rank stores and
  loads its own KV heads, in a CPU pool and an SSD store of its own;
* a *replicated* cache (MLA's latent cache, the same on every rank): one pool
  that every rank maps, written by rank 0 only and read by all; one SSD store,
  rank 0's.

``cpu_bytes`` and ``ssd_bytes`` are per engine: the pools (or SSD stores)
split them evenly. Example: ``cpu_bytes=32GiB`` at TP 4 gives each rank an
8 GiB pool of a sharded cache, or one 32 GiB pool shared by the four ranks of
a replicated one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["SINGLE_RANK", "RankSetup", "TPPlacement"]


@dataclass(frozen=True)
class TPPlacement:
    """Where one engine's chunk bytes live across its ``tp_size`` ranks."""

    tp_size: int = 1
    replicated: bool = False

    def __post_init__(self) -> None:
        assert self.tp_size >= 1, self

    @property
    def stores(self) -> int:
        """CPU pools (and SSD stores) per engine."""
        return 1 if self.replicated else self.tp_size

    @property
    def shared_pool(self) -> bool:
        """Several ranks map one pool."""
        return self.replicated and self.tp_size > 1

    def writes(self, rank: int) -> bool:
        """Whether ``rank`` writes chunk bytes (stores, SSD writes and reads); every rank
        loads its KV cache from the pool."""
        return not self.replicated or rank == 0

    def store_ranks(self) -> range:
        """The ranks that own a CPU pool and an SSD store."""
        return range(self.stores)

    def per_store(self, engine_bytes: int) -> int:
        """One pool's (or SSD store's) share of an engine-wide budget."""
        return engine_bytes // self.stores


SINGLE_RANK = TPPlacement()
"""An engine without tensor parallelism."""


@dataclass(frozen=True)
class RankSetup:
    """What one worker needs to know about its place in the engine, given at registration."""

    rank: int = 0
    placement: TPPlacement = SINGLE_RANK
    shard_digest: bytes | None = None
    """The namespace digest of this rank's bytes (names its SSD store)."""
    shared_pool: Path | None = None
    """The file every rank maps for a replicated cache's pool (``placement.shared_pool``)."""

    @property
    def writes(self) -> bool:
        return self.placement.writes(self.rank)
