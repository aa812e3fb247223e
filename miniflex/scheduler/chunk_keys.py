"""A request's chunk keys, kept in step with vLLM's block hashes.

A chunk's key is derived from the hash of its last block (:func:`miniflex.keys.chunk_key`),
and hashes chain, so a key vouches for every block before it. :class:`ChunkKeys` holds a
request's keys in prefix order three ways at once: the keys, the block hash each came from,
and the ``(n, 2)`` uint64 array the index matches in one compiled call. Its invariant: the
three describe the same chunks. ``sync`` is the only writer.

Example::

    keys = ChunkKeys()
    kept = keys.sync(ns, block_hashes)   # extended to the full chunks of the hashes
    keys[:2], keys.array[:2]             # the first two keys, as a list and as an array
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np

from miniflex.index import keys_to_array
from miniflex.keys import Namespace, chunk_key
from miniflex.types import ChunkKey

__all__ = ["ChunkKeys"]


class ChunkKeys(Sequence[ChunkKey]):
    """A request's chunk keys in prefix order (a read-only sequence; ``sync`` writes)."""

    def __init__(self) -> None:
        self._keys: list[ChunkKey] = []
        self._sources: list[bytes] = []  # vLLM's block hash each key came from
        self.array: np.ndarray = keys_to_array([])
        """The keys as the index matches them: one row of two uint64 words per key."""

    def __len__(self) -> int:
        return len(self._keys)

    @overload
    def __getitem__(self, i: int) -> ChunkKey: ...
    @overload
    def __getitem__(self, i: slice) -> list[ChunkKey]: ...
    def __getitem__(self, i: int | slice) -> ChunkKey | list[ChunkKey]:
        return self._keys[i]

    def __repr__(self) -> str:
        return f"ChunkKeys({self._keys!r})"

    def sync(self, ns: Namespace, block_hashes: Sequence[bytes]) -> int:
        """Match the keys to ``block_hashes``; returns how many leading keys were kept.

        vLLM can rewrite a request's trailing hashes (streaming-input sessions replace the
        tail of a prompt), so keys whose source hash changed are dropped first; the last
        key that still matches vouches for every key before it (normally the first one
        checked). Then a key is added for each further full chunk of the hashes.
        """
        bpc = ns.blocks_per_chunk
        n = min(len(self._keys), len(block_hashes) // bpc)
        while n and block_hashes[n * bpc - 1] != self._sources[n - 1]:
            n -= 1
        if n < len(self._keys):
            del self._keys[n:], self._sources[n:]
            self.array = self.array[:n]
        full = len(block_hashes) // bpc
        if full > n:
            sources = [bytes(block_hashes[i * bpc - 1]) for i in range(n + 1, full + 1)]
            new = [chunk_key(ns, h) for h in sources]
            self._keys += new
            self._sources += sources
            self.array = np.concatenate([self.array, keys_to_array(new)])
        return n

    def check(self) -> None:
        """Assert the invariant: keys, sources and array rows describe the same chunks."""
        assert len(self._sources) == len(self._keys) == len(self.array), (
            f"{len(self._keys)} keys, {len(self._sources)} sources, {len(self.array)} rows"
        )
