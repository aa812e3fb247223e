"""Chunk index and eviction policies of MiniFlex.

* :class:`HashIndex` maps 128-bit chunk keys to ``(Tier, SlotId)`` with a
  Numba-compiled open-addressing table; batch queries (``prefix_match``,
  ``lookup_many``) are a single compiled call over a ``(n, 2)`` uint64 array
  made by :func:`keys_to_array`.
* :class:`EvictionPolicy` (:class:`LRUPolicy`, :class:`FIFOPolicy`) picks the
  victim slot of a tier, honouring pins. Use :func:`make_policy` to build one
  by name.
"""

from __future__ import annotations

from miniflex.index.hashindex import HashIndex, compile_kernels
from miniflex.index.key_words import array_to_keys, keys_to_array, split_key
from miniflex.index.policy import POLICIES, EvictionPolicy, FIFOPolicy, LRUPolicy, make_policy

__all__ = [
    "POLICIES",
    "EvictionPolicy",
    "FIFOPolicy",
    "HashIndex",
    "LRUPolicy",
    "array_to_keys",
    "compile_kernels",
    "keys_to_array",
    "make_policy",
    "split_key",
]
