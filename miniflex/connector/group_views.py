"""One KV cache group of a hybrid model, seen as the one-group model MiniFlex serves.

With vLLM's hybrid KV cache manager on, every group has a block table of its
own, and vLLM's objects carry one list of block ids per group (in group order).
``MiniFlexGroupsConnector`` runs one ``MiniFlexConnector`` per group; these
views hand each of them its group as group 0 of a one-group model:

* ``group_config``: the KV cache config with only group ``g``, a sliding-window
  spec given as the full-attention spec of the same pages (which pages a window
  needs is the caller's business, ``miniflex/hybrid.py``);
* ``GroupBlocks``: ``update_state_after_alloc``'s blocks of group ``g``;
* ``group_output``: a ``SchedulerOutput`` whose block ids are group ``g``'s.
"""

from __future__ import annotations

import copy
from typing import Any

from miniflex.hybrid import GroupNeed

__all__ = ["GroupBlocks", "group_config", "group_need", "group_output"]

SERVED_KINDS = frozenset({"FullAttentionSpec", "SlidingWindowSpec"})


def group_need(spec: Any) -> GroupNeed:
    """What a group of ``spec`` reads of a prefix (a window, or all of it)."""
    if type(spec).__name__ == "SlidingWindowSpec":
        return GroupNeed(int(spec.sliding_window))
    return GroupNeed()


def group_config(kv_cache_config: Any, g: int) -> Any:
    """``kv_cache_config`` with group ``g`` alone, as a full-attention group."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec

    group = kv_cache_config.kv_cache_groups[g]
    spec = group.kv_cache_spec
    full = FullAttentionSpec(
        block_size=spec.block_size,
        num_kv_heads=spec.num_kv_heads,
        head_size=spec.head_size,
        dtype=spec.dtype,
    )
    one = copy.copy(kv_cache_config)
    one.kv_cache_groups = [KVCacheGroupSpec(list(group.layer_names), full)]
    return one


class GroupBlocks:
    """vLLM's ``KVCacheBlocks`` of one group, as a one-group model's."""

    def __init__(self, block_ids: list[int]) -> None:
        self._ids = block_ids

    def get_block_ids(self) -> tuple[list[int]]:
        return (self._ids,)


class _View:
    """``obj`` with some attributes replaced; every other one read from ``obj``."""

    def __init__(self, obj: Any, **replaced: Any) -> None:
        self._obj = obj
        self.__dict__.update(replaced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._obj, name)


def group_output(so: Any, g: int) -> Any:
    """``SchedulerOutput`` ``so`` with group ``g``'s block ids as the only group's."""
    new = [_View(r, block_ids=(list(r.block_ids[g]),)) for r in so.scheduled_new_reqs]
    cached = so.scheduled_cached_reqs
    ids = [None if b is None else (list(b[g]),) for b in cached.new_block_ids]
    return _View(so, scheduled_new_reqs=new, scheduled_cached_reqs=_View(cached, new_block_ids=ids))
