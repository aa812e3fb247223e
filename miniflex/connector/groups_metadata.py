"""What vLLM carries between the halves of ``MiniFlexGroupsConnector``: one per KV cache group."""

from __future__ import annotations

from dataclasses import dataclass

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

from miniflex.connector.metadata import MiniFlexMetadata, MiniFlexWorkerMeta

__all__ = ["GroupsMetadata", "GroupsWorkerMeta"]


@dataclass(frozen=True)
class GroupsMetadata(KVConnectorMetadata):
    """Scheduler -> workers, once per engine step: group ``g``'s plan is ``metas[g]``."""

    metas: tuple[MiniFlexMetadata, ...]


@dataclass(frozen=True)
class GroupsWorkerMeta(KVConnectorWorkerMetadata):
    """Worker -> scheduler: group ``g``'s report is ``metas[g]`` (None: nothing to report)."""

    metas: tuple[MiniFlexWorkerMeta | None, ...]

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        """Merge another rank's report, group by group (vLLM's output aggregator, TP > 1)."""
        assert isinstance(other, GroupsWorkerMeta), type(other)
        merged = tuple(
            b if a is None else a if b is None else a.aggregate(b)
            for a, b in zip(self.metas, other.metas, strict=True)
        )
        return GroupsWorkerMeta(merged)  # type: ignore[arg-type]
