"""What each tier gains and loses, chunk by chunk, in the terms vLLM's KV events use.

A router that reads vLLM's KV events (``BlockStored``/``BlockRemoved``) learns
which prefixes an engine holds on its GPU. This module tells it the same of
MiniFlex's tiers: each chunk a tier publishes or drops (a store, a promotion, a
write-back to SSD, an eviction, a corrupt read, a reset) becomes one
:class:`TierChange` that names the vLLM block hashes and the token ids the chunk
covers, so a prefix on CPU or SSD looks to the router as one on the GPU does.

A chunk's key is derived from its last block's hash and cannot be turned back
into hashes and tokens, so they are noted (:meth:`ChunkEvents.describe`) while
a request that computes or loads the chunk is alive, and kept while some tier
holds the chunk (about 2 KiB of scheduler memory per chunk of 256 tokens). A
chunk that no request described (one an SSD store recovered at start-up) is
announced with its key as its only hash, no tokens and ``block_size`` 0, as
vLLM's own offloading connector announces chunks it knows no more of. A
removal names exactly the hashes its tier's store announced.

Example::

    events = ChunkEvents(blocks_per_chunk=4, block_size=16)
    events.watch(stack.cpu)
    events.watch(stack.ssd)
    events.describe("r1", keys, request.block_hashes, request.all_token_ids, upto=2)
    ...                                   # the tiers publish, demote, evict
    for change in events.take():          # in the order the tiers changed
        change.stored, change.tier, change.chunk.block_hashes
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from miniflex.tiers import SlotTier
from miniflex.types import ChunkKey, ReqId, Tier

__all__ = ["PENDING_CHUNKS", "ChunkEvents", "ChunkInfo", "TierChange"]

PENDING_CHUNKS = 4096
"""Descriptions kept for chunks no tier holds: described and not stored yet, or dropped by
every tier (a write-back may be landing it on SSD). The oldest go first; a chunk published
after its description went is announced as one no request described."""


@dataclass(frozen=True)
class ChunkInfo:
    """What an event says of one chunk: vLLM's hashes of its blocks, in order, the hash of
    the block before it (None: the chunk starts a prompt), its tokens and LoRA."""

    block_hashes: tuple[bytes, ...]
    parent: bytes | None
    token_ids: np.ndarray  # int32, len(block_hashes) * block_size of them; empty: unknown
    block_size: int  # tokens a hash covers; 0: unknown (a placeholder)
    lora_id: int | None = None
    lora_name: str | None = None

    @property
    def placeholder(self) -> bool:
        return self.block_size == 0


@dataclass(frozen=True)
class TierChange:
    """One chunk became visible (``stored``) in ``tier``, or stopped being visible there."""

    stored: bool
    tier: Tier
    chunk: ChunkInfo


class ChunkEvents:
    """Records the tiers' changes as they happen and describes them on :meth:`take`;
    scheduler side, one thread."""

    def __init__(self, blocks_per_chunk: int, block_size: int) -> None:
        """``blocks_per_chunk`` vLLM blocks of ``block_size`` tokens make a chunk."""
        self.blocks_per_chunk = blocks_per_chunk
        self.block_size = block_size
        self._log: list[tuple[bool, Tier, ChunkKey]] = []
        self._pending: OrderedDict[ChunkKey, ChunkInfo] = OrderedDict()
        self._held: dict[ChunkKey, dict[Tier, ChunkInfo]] = {}  # as announced, per tier
        self._described: dict[ReqId, int] = {}  # leading chunks of a request described

    def watch(self, tier: SlotTier | None) -> None:
        """Record every chunk ``tier`` publishes or drops from now on (None: no tier)."""
        if tier is None:
            return
        name = tier.tier
        tier.watch = lambda stored, key: self._log.append((stored, name, key))

    def describe(
        self,
        req_id: ReqId,
        keys: Sequence[ChunkKey],
        block_hashes: Sequence[bytes],
        token_ids: Sequence[int],
        upto: int,
        lora: tuple[int, str] | None = None,
    ) -> None:
        """Note what the request's chunks ``keys[:upto]`` hold (each chunk once per request):
        ``block_hashes`` and ``token_ids`` are the request's, ``lora`` its adapter's id and
        name. Call it while the chunks may still be stored or loaded."""
        bpc, bs = self.blocks_per_chunk, self.block_size
        upto = min(upto, len(keys), len(block_hashes) // bpc, len(token_ids) // (bpc * bs))
        first = self._described.get(req_id, 0)
        for i in range(first, upto):
            key = keys[i]
            held = self._held.get(key)
            if held is not None and not all(c.placeholder for c in held.values()):
                continue
            chunk = ChunkInfo(
                tuple(bytes(h) for h in block_hashes[i * bpc : (i + 1) * bpc]),
                bytes(block_hashes[i * bpc - 1]) if i else None,
                np.asarray(token_ids[i * bpc * bs : (i + 1) * bpc * bs], dtype=np.int32),
                bs,
                *(lora if lora is not None else (None, None)),
            )
            self._remember(key, chunk)
        self._described[req_id] = max(first, upto)

    def _remember(self, key: ChunkKey, chunk: ChunkInfo) -> None:
        """Keep a description of a chunk that no tier holds (the oldest such go first)."""
        self._pending[key] = chunk
        self._pending.move_to_end(key)
        if len(self._pending) > PENDING_CHUNKS:
            self._pending.popitem(last=False)

    def forget(self, req_id: ReqId) -> None:
        """The request ended: nothing more of it is described."""
        self._described.pop(req_id, None)

    def take(self) -> list[TierChange]:
        """The changes since the last call, in the order they happened."""
        log, self._log = self._log, []
        out: list[TierChange] = []
        for stored, tier, key in log:
            held = self._held.get(key)
            if stored:
                chunk = self._info(key, held)
                self._held.setdefault(key, {})[tier] = chunk
                out.append(TierChange(True, tier, chunk))
                continue
            chunk = held.pop(tier, None) if held is not None else None
            if chunk is None:  # not announced (a change before the tier was watched)
                continue
            if not held:  # in no tier now; it may land in one soon (a write-back in flight)
                del self._held[key]
                if not chunk.placeholder:
                    self._remember(key, chunk)
            out.append(TierChange(False, tier, chunk))
        return out

    def _info(self, key: ChunkKey, held: dict[Tier, ChunkInfo] | None) -> ChunkInfo:
        """The best description of a chunk being stored: a request's, else another tier's
        announcement, else a placeholder named by its key."""
        described = self._pending.pop(key, None)
        if described is not None:
            return described
        known = list(held.values()) if held else []
        if known:
            return next((c for c in known if not c.placeholder), known[0])
        return ChunkInfo((key.to_bytes(16, "big"),), None, np.empty(0, np.int32), 0)

    @property
    def chunks_held(self) -> int:
        """Chunks announced in some tier and not removed from all of them."""
        return len(self._held)
