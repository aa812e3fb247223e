"""Chunk keys: 128-bit names of chunks, scoped by a namespace.

A chunk is ``blocks_per_chunk`` consecutive vLLM blocks of one request. Its key
is derived from vLLM's chained block hash of the chunk's *last* block (which
already folds in the whole prefix, LoRA and ``cache_salt``) plus the namespace's
``key_digest``, so that one model, dtype, layout or TP size never reads
another's KV, nor does the same model after a change to its configuration,
weights or KV-changing settings (``model_digest``). One plan drives every TP
rank, so a key names the chunk on all of them; each rank's bytes of it (its
*shard*) are tagged, on SSD and in a remote store, with the ``digest`` of its
own namespace, ``ns.shard(rank)``, which adds the rank::

    ns = Namespace(model="m", dtype="bfloat16", layout="LBNHC", num_layers=36,
                   num_kv_heads=8, head_size=128, block_size=16, blocks_per_chunk=4)
    key = chunk_key(ns, request.block_hashes[3])  # the first chunk: blocks 0-3

:func:`chunk_keys_from_tokens` is a plain chained hash over token ids with the
same properties, so MiniFlex can be used and tested without vLLM.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from miniflex.layout import KVGeometry
from miniflex.types import ChunkKey

__all__ = [
    "FORMAT_VERSION",
    "Namespace",
    "namespace_for",
    "chunk_key",
    "chunk_keys_from_tokens",
]

FORMAT_VERSION = 3
"""Bumped whenever the byte layout of a stored chunk or the derivation of keys changes
(2: keys leave out the TP rank; MLA latent pages; 3: the model's identity)."""

_KEY_BYTES = 16


@dataclass(frozen=True)
class Namespace:
    """Everything that must match for two processes to share a chunk's bytes.

    ``tp_rank`` is the rank whose shard of each chunk a store holds: every rank of
    a TP engine keeps its own KV heads. A ``replicated`` cache (MLA's latent
    cache) is the same on every rank, so its only shard is rank 0's.
    """

    model: str
    dtype: str
    layout: str
    num_layers: int
    num_kv_heads: int
    head_size: int
    block_size: int
    blocks_per_chunk: int
    tp_rank: int = 0
    tp_size: int = 1
    latent: bool = False
    """Pages hold one latent vector per token (MLA), not separate K and V."""
    replicated: bool = False
    """Every TP rank holds the same bytes (MLA), so one rank writes them and all read them."""
    model_digest: str = ""
    """The model's identity beyond its shapes: configuration, weights, the settings that
    change KV (:func:`miniflex.model_identity.model_identity`)."""
    format_version: int = FORMAT_VERSION
    kv_group: str = ""
    """The KV cache group of a hybrid model whose layers these chunks hold (its layer
    names); "" for a model served as one group. Each group of a hybrid model has chunks of
    its own under the same block hashes, so the group must be part of their keys."""

    @property
    def chunk_tokens(self) -> int:
        return self.block_size * self.blocks_per_chunk

    def shard(self, rank: int) -> Namespace:
        """The namespace of TP rank ``rank``'s bytes (rank 0's for a replicated cache)."""
        return dataclasses.replace(self, tp_rank=0 if self.replicated else rank)

    @functools.cached_property
    def digest(self) -> bytes:
        """16 bytes that change whenever any field changes: names one rank's shard."""
        return _digest(self, ())

    @functools.cached_property
    def key_digest(self) -> bytes:
        """16 bytes over every field but ``tp_rank``: chunk keys are the same on every rank."""
        return _digest(self, ("tp_rank",))


def namespace_for(
    model: str,
    geometry: KVGeometry,
    layout: str,
    tp_size: int = 1,
    replicated: bool = False,
    model_digest: str = "",
    kv_group: str = "",
) -> Namespace:
    """The namespace of a model's chunks of ``geometry`` in page order ``layout``
    (``model_digest``: :func:`miniflex.model_identity.model_identity`; ``kv_group``: see
    :attr:`Namespace.kv_group`)."""
    return Namespace(
        model=model,
        dtype=geometry.dtype,
        layout=layout,
        num_layers=geometry.num_layers,
        num_kv_heads=geometry.num_kv_heads,
        head_size=geometry.head_size,
        block_size=geometry.block_size,
        blocks_per_chunk=geometry.blocks_per_chunk,
        tp_size=tp_size,
        latent=geometry.latent,
        replicated=replicated,
        model_digest=model_digest,
        kv_group=kv_group,
    )


_ADDED_LATER = {"kv_group": ""}
"""Fields added after FORMAT_VERSION 3, left out of a digest while at these values: the
keys of every namespace that does not use them stay what they were."""


def _digest(ns: Namespace, leave_out: tuple[str, ...]) -> bytes:
    fields = [
        f
        for f in dataclasses.fields(ns)
        if f.name not in leave_out and _ADDED_LATER.get(f.name, object()) != getattr(ns, f.name)
    ]
    text = "|".join(f"{f.name}={getattr(ns, f.name)}" for f in fields)
    return hashlib.blake2b(text.encode(), digest_size=_KEY_BYTES).digest()


def chunk_key(ns: Namespace, block_hash: bytes) -> ChunkKey:
    """The key of the chunk whose last block has vLLM chained hash ``block_hash``."""
    h = hashlib.blake2b(block_hash, digest_size=_KEY_BYTES, key=ns.key_digest)
    return ChunkKey(int.from_bytes(h.digest(), "little"))


def chunk_keys_from_tokens(ns: Namespace, token_ids: Sequence[int]) -> list[ChunkKey]:
    """Chained 128-bit hash of token ids, one key per full chunk of ``ns.chunk_tokens``.

    Key ``i`` depends on every token of chunks ``0..i``, so equal keys mean
    equal prefixes (up to hash collisions at 2**-128).
    """
    n = ns.chunk_tokens
    tokens = np.asarray(token_ids, dtype=np.int64)
    keys: list[ChunkKey] = []
    prev = ns.key_digest
    for start in range(0, len(tokens) - n + 1, n):
        prev = hashlib.blake2b(
            tokens[start : start + n].tobytes(), digest_size=_KEY_BYTES, key=prev
        ).digest()
        keys.append(ChunkKey(int.from_bytes(prev, "little")))
    return keys
