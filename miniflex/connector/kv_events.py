"""Tier-tagged KV events: MiniFlex's tier changes as vLLM's own ``BlockStored``/``BlockRemoved``.

With vLLM's KV events on (``--kv-events-config '{"enable_kv_cache_events": true,
"publisher": "zmq", "endpoint": "tcp://*:5557"}'``), vLLM's scheduler publishes
after every step the events of its GPU prefix cache and what its connector's
``take_events`` returns, through its own publisher. MiniFlex adds one event per
chunk that its CPU or SSD tier gains or loses (:mod:`miniflex.scheduler.chunk_events`),
as vLLM's classes, so a router that reads vLLM's events needs nothing new:

* ``BlockStored``: the chunk's blocks (``block_hashes``, the same hashes the GPU
  events carry), ``parent_block_hash``, ``token_ids``, ``block_size``, LoRA, and
  ``medium``: ``"CPU"`` for the CPU tier, vLLM's name of its own disk tier for the
  SSD tier (``"STORAGE"``; ``"FS"`` on vLLM 0.26);
  ``locality`` ``"LOCAL"``;
* ``BlockRemoved``: the same hashes, when the tier drops the chunk (eviction,
  write-back done, a corrupt read, a reset).

A chunk held by both tiers (written back to SSD, not yet evicted from CPU) has one
``BlockStored`` per tier. Nothing is emitted for the remote store, whose contents
change without this engine knowing. Off unless vLLM's KV events are on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from miniflex.connector import compat
from miniflex.keys import Namespace
from miniflex.scheduler.chunk_events import ChunkEvents, ChunkInfo, TierChange
from miniflex.scheduler.manager import MiniFlexManager
from miniflex.scheduler.requests import ScheduledReq
from miniflex.types import ReqId, Tier

__all__ = ["TierEvents", "medium_of"]

LOCALITY = "LOCAL"


def medium_of(tier: Tier) -> str:
    """The ``medium`` of ``tier``'s events, as this vLLM names it."""
    from vllm.distributed import kv_events

    if tier is Tier.CPU:
        return kv_events.MEDIUM_CPU
    return getattr(kv_events, "MEDIUM_STORAGE", None) or getattr(kv_events, "MEDIUM_FS", "FS")


class TierEvents:
    """The scheduler connector's events; inert (every call returns at once) unless on."""

    def __init__(self, manager: MiniFlexManager, ns: Namespace, on: bool) -> None:
        self._manager = manager
        self.chunks: ChunkEvents | None = None
        if on:
            self.chunks = ChunkEvents(ns.blocks_per_chunk, ns.chunk_tokens // ns.blocks_per_chunk)
            self.chunks.watch(manager.cpu)
            self.chunks.watch(manager.ssd)

    @classmethod
    def for_engine(cls, vllm_config: Any, manager: MiniFlexManager, ns: Namespace) -> TierEvents:
        """On where the engine publishes KV events (``kv_events_config``)."""
        cfg = getattr(vllm_config, "kv_events_config", None)
        return cls(manager, ns, bool(cfg is not None and cfg.enable_kv_cache_events))

    def note(self, request: Any) -> None:
        """Describe the request's full chunks known so far (see ``ChunkEvents.describe``)."""
        if self.chunks is None:
            return
        st = self._manager.find_state(request.request_id)
        if st is None or not st.keys:
            return
        lora = getattr(request, "lora_request", None)
        self.chunks.describe(
            request.request_id,
            st.keys,
            compat.block_hashes(request),
            request.all_token_ids,
            len(st.keys),
            (lora.adapter_id, lora.name) if lora is not None else None,
        )

    def scheduled(self, scheduled: Sequence[ScheduledReq], requests: dict[ReqId, Any]) -> None:
        """After a plan: describe what this step's requests may store."""
        if self.chunks is None:
            return
        for s in scheduled:
            request = requests.get(s.req_id)
            if request is not None:
                self.note(request)

    def forget(self, req_id: ReqId) -> None:
        if self.chunks is not None:
            self.chunks.forget(req_id)

    def take(self) -> list[Any]:
        """vLLM's events for the tier changes since the last call (the connector's
        ``take_events``)."""
        if self.chunks is None:
            return []
        return [_event(change) for change in self.chunks.take()]


def _event(change: TierChange) -> Any:
    from vllm.distributed.kv_events import BlockRemoved, BlockStored
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    c: ChunkInfo = change.chunk
    hashes = [maybe_convert_block_hash(h) for h in c.block_hashes]
    medium, where = medium_of(change.tier), {"locality": LOCALITY}
    if not change.stored:
        return BlockRemoved(block_hashes=hashes, medium=medium, **_known(BlockRemoved, where))
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=maybe_convert_block_hash(c.parent) if c.parent is not None else None,
        token_ids=c.token_ids.tolist(),
        block_size=c.block_size,
        lora_id=c.lora_id,
        medium=medium,
        lora_name=c.lora_name,
        **_known(BlockStored, where),
    )


def _known(cls: type, fields: dict[str, Any]) -> dict[str, Any]:
    """The ``fields`` this vLLM's event class has (every supported version has ``medium``
    and ``lora_name``; ``locality`` is newer)."""
    have = set(getattr(cls, "__struct_fields__", ()))
    return {k: v for k, v in fields.items() if k in have}
