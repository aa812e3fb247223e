"""Typed ids shared by every layer of MiniFlex (no heavy dependencies)."""

from __future__ import annotations

import enum
from typing import NewType

__all__ = ["BlockId", "ChunkKey", "ReqId", "SlotId", "Tier"]

ChunkKey = NewType("ChunkKey", int)
"""A 128-bit chunk key as a Python int in ``[0, 2**128)``."""

SlotId = NewType("SlotId", int)
"""Index of a chunk-sized slot inside one tier (CPU pool row, SSD file slot)."""

BlockId = NewType("BlockId", int)
"""Index of a block in vLLM's paged KV cache."""

ReqId = NewType("ReqId", str)
"""vLLM's request id."""


class Tier(enum.IntEnum):
    """Where a chunk lives. Lower values are faster."""

    CPU = 1
    SSD = 2
    REMOTE = 3
    """The store shared by a fleet (``remote_url``): never indexed locally, asked per lookup."""
