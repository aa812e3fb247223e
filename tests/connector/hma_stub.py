"""A ``SupportsHMA`` connector that only records what vLLM's scheduler hands it, per group.

It claims a fixed external hit for the requests named in ``HITS`` (loaded inside
the step: no worker is involved) and records the block ids of every group that
vLLM allocates for them and finishes them with. ``test_hybrid_groups.py`` reads
those records to pin down vLLM's hybrid KV cache manager.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    SupportsHMA,
)

HITS: dict[str, int] = {}
"""Request id -> tokens this connector claims to hold beyond vLLM's own hit."""
ALLOCATED: dict[str, tuple[int, tuple[list[int], ...]]] = {}
"""Request id -> (external tokens, every group's block ids) from update_state_after_alloc."""
FINISHED: dict[str, tuple[list[int], ...]] = {}
"""Request id -> every group's block ids from request_finished_all_groups."""


class GroupRecorder(KVConnectorBase_V1, SupportsHMA):
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple:
        return max(0, HITS.get(request.request_id, 0) - num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external: int) -> None:
        if num_external:
            ALLOCATED[request.request_id] = (num_external, blocks.get_block_ids())

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple:
        raise AssertionError("vLLM calls request_finished_all_groups on a SupportsHMA connector")

    def request_finished_all_groups(self, request: Any, block_ids: tuple) -> tuple:
        FINISHED[request.request_id] = tuple(list(g) for g in block_ids)
        return False, None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None
