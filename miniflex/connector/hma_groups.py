"""``MiniFlexGroupsConnector``: a hybrid model's KV cache groups, each served by a MiniFlex.

``MiniFlexHMAConnector`` builds this for a model of several KV cache groups
(vLLM's hybrid KV cache manager on: Gemma-3 / gpt-oss style sliding-window and
full-attention layers). Each group gets a ``MiniFlexConnector`` of its own
(its layers, its block table, its CPU pool: ``cpu_bytes`` split evenly), and
this facade forwards every hook to them, joining what vLLM must see once:

* a hit is the longest prefix for which every group holds what it needs
  (``miniflex.hybrid.longest_hit``): the whole prefix for full attention, the
  window before the hit's end for a sliding window;
* a sliding-window group loads only its blocks from the window's start (vLLM
  gives it null blocks before), and stores only ``GroupNeed.kept_chunks`` of
  each step: its windows, not the prefix. vLLM frees its blocks that leave the
  window while the request runs, so those stores are finished in
  ``wait_for_save``, before any later forward can reuse the blocks;
* a request is in ``finished_recving`` / ``finished_sending`` once every group
  that had a load / held its blocks for stores has reported it; a load that failed
  in any group is reported then too, by request (``failed_recving``, vLLM 0.30+), and
  vLLM recomputes the request (before 0.30, by block: vLLM recomputes from there).

Loads are asynchronous only (``load_mode`` is set to ``async``). Each group's chunks
have keys of their own (``Namespace.kv_group``: its layers), and with ``ssd_dirs``
each group has an SSD store of its own in ``<dir>/group<g>`` (``ssd_bytes`` split
evenly); a group holds a chunk in either tier, or in the remote store
(:mod:`miniflex.connector.group_residency`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import defaultdict
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from miniflex.config import MiniFlexConfig
from miniflex.connector import compat
from miniflex.connector.connector import MiniFlexConnector
from miniflex.connector.group_residency import group_held
from miniflex.connector.group_views import (
    SERVED_KINDS,
    GroupBlocks,
    group_config,
    group_need,
    group_output,
)
from miniflex.connector.groups_metadata import GroupsMetadata, GroupsWorkerMeta
from miniflex.connector.model_kinds import geometry_for
from miniflex.errors import ConfigError
from miniflex.hybrid import longest_hit
from miniflex.plan import JobKind
from miniflex.ranks import TPPlacement
from miniflex.ssd.preflight import check_ssd_tier
from miniflex.ssd.store import make_dirs

__all__ = ["MiniFlexGroupsConnector", "serves_groups"]

logger = logging.getLogger("miniflex.connector")
_HMA = compat.hma_base()
_RESULTS = compat.transfer_results_class()
_BASES: tuple[type, ...] = (KVConnectorBase_V1,) if _HMA is None else (KVConnectorBase_V1, _HMA)


def serves_groups(kv_cache_config: Any) -> bool:
    """True: several groups, each full attention or a sliding window (this facade's)."""
    groups = list(kv_cache_config.kv_cache_groups) if kv_cache_config is not None else []
    kinds = {type(g.kv_cache_spec).__name__ for g in groups}
    return len(groups) > 1 and kinds <= SERVED_KINDS


def _group_settings(config: MiniFlexConfig, g: int, count: int, main: int) -> MiniFlexConfig:
    """Group ``g``'s share of the settings: ``cpu_bytes``, ``ssd_bytes`` and
    ``ssd_stream_bytes`` split evenly,
    async loads, its own pool file and SSD directories; the status file and backfill are
    the ``main`` group's."""
    return dataclasses.replace(
        config,
        cpu_bytes=config.cpu_bytes // count,
        ssd_dirs=_group_dirs(config.ssd_dirs, g),
        ssd_bytes=config.ssd_bytes // count,
        ssd_stream_bytes=config.ssd_stream_bytes // count,
        load_mode="async",
        cpu_pool_file=f"{config.cpu_pool_file}.g{g}" if config.cpu_pool_file else None,
        status_file=config.status_file if g == main else None,
        backfill_s=config.backfill_s if g == main else 0.0,
    )


def _group_dirs(dirs: tuple[str, ...], g: int) -> tuple[str, ...]:
    """``<dir>/group<g>`` for each SSD directory (each ``<dir>`` exists: the config checked
    it), created as the SSD store creates its rank directories."""
    out = tuple(os.path.join(d, f"group{g}") for d in dirs)
    make_dirs(out, "ssd_dirs")
    return out


class MiniFlexGroupsConnector(*_BASES):  # type: ignore[misc]
    """One ``MiniFlexConnector`` per KV cache group behind one vLLM connector."""

    _cache_hit_source = MiniFlexConnector._cache_hit_source

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        compat.quiet_connector_notice()
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        config = MiniFlexConfig.from_dict(extra)
        self.model = compat.model_name(vllm_config)
        groups = list(kv_cache_config.kv_cache_groups)
        self.needs = [group_need(g.kv_cache_spec) for g in groups]
        self.layers = [list(g.layer_names) for g in groups]
        if len({len(names) for names in self.layers}) != 1:  # vLLM's groups never differ
            geometry_for(compat.engine_layout(vllm_config), kv_cache_config, config.chunk_blocks)
        self.block_size = int(groups[0].kv_cache_spec.block_size)
        self.chunk_tokens = config.chunk_blocks(self.block_size) * self.block_size
        self._check_windows(config)  # before any group's MiniFlex starts
        if config.ssd_dirs and role == KVConnectorRole.WORKER:  # all groups' stores at once:
            per_rank = TPPlacement(compat.tp_size(vllm_config)).per_store(config.ssd_bytes)
            check_ssd_tier(config.ssd_dirs, per_rank, None, ranks=[compat.tp_rank()])
        self.main = next(g for g, need in enumerate(self.needs) if need.window is None)
        """The full-attention group whose stats, status and hits vLLM is shown."""
        self.parts = [
            MiniFlexConnector(
                vllm_config,
                role,
                group_config(kv_cache_config, g),
                _group_settings(config, g, len(groups), self.main),
                kv_group=",".join(self.layers[g]),
            )
            for g in range(len(groups))
        ]
        assert self.parts[0].geometry.chunk_tokens == self.chunk_tokens
        self._floor: dict[str, int] = {}
        """Request -> its first chunk whose window-group blocks are all real (vLLM gives a
        window group null blocks before the window of the tokens it was admitted with)."""
        self._recv_wait: dict[str, set[int]] = defaultdict(set)
        self._send_wait: dict[str, set[int]] = defaultdict(set)
        self._failed: set[str] = set()  # loads failed in a group, not reported to vLLM yet
        logger.info(
            "MiniFlex serves %d KV cache groups (windows %s), %d layers each",
            len(groups),
            [n.window for n in self.needs],
            len(self.layers[0]),
        )

    def _check_windows(self, config: MiniFlexConfig) -> None:
        if all(n.window is not None for n in self.needs):
            raise ConfigError("model", self.model, "no KV cache group of full attention")
        for need in self.needs:
            if need.window is not None and need.window < self.chunk_tokens:
                raise ConfigError(
                    "blocks_per_chunk",
                    config.blocks_per_chunk,
                    f"a chunk ({self.chunk_tokens} tokens) must fit in the sliding window "
                    f"({need.window} tokens): a window's chunk is stored in the step that "
                    "computes it, while vLLM still holds all its blocks",
                )
        tier = "ssd_dirs" if config.ssd_dirs else "remote_url" if config.remote_url else None
        if tier is not None and _RESULTS is None:
            raise ConfigError(
                tier,
                getattr(config, tier),
                "a hybrid model's SSD and remote tiers need vLLM 0.30 or newer: before it, a "
                "load that failed in one KV cache group cannot be reported to vLLM",
            )

    # ---------------- scheduler side ----------------
    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        main = self.parts[self.main]
        decided = main.get_num_new_matched_tokens(request, num_computed_tokens)[0]
        if decided is None:
            return None, False  # passed over (backfill, the main group's): ask no other group
        others = [p for g, p in enumerate(self.parts) if g != self.main]
        if any(
            p.get_num_new_matched_tokens(request, num_computed_tokens)[0] is None for p in others
        ):
            return None, False
        keys = main.manager.state_for(request.request_id).keys
        ct = self.chunk_tokens
        end = longest_hit(
            self.needs,
            group_held(
                [p.manager for p in self.parts],
                self.main,
                request.request_id,
                num_computed_tokens // ct,
                -(-(num_computed_tokens + decided) // ct),
            ),
            len(keys),
            # no more than the main group decided to load (its cost model may recompute SSD
            # chunks): a shorter hit needs another window, so it is searched for, not cut
            min(request.num_tokens - 1, num_computed_tokens + decided),
            self.chunk_tokens,
            self.block_size,
        )
        n = max(0, end - num_computed_tokens)
        return n, n > 0

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        ids = compat.group_block_ids(blocks.get_block_ids())
        for g, part in enumerate(self.parts):
            n = num_external_tokens
            if n > 0 and self.needs[g].window is not None:
                st = part.manager.state_for(request.request_id)
                end = st.num_computed_tokens + n
                first = max(st.num_computed_tokens, self.needs[g].first_needed_token(end))
                st.num_computed_tokens = first // self.block_size * self.block_size
                n = end - st.num_computed_tokens  # the window's blocks: vLLM's are null before
            part.update_state_after_alloc(request, GroupBlocks(ids[g]), n)

    def get_external_cache_hit_sources(self, request: Any, num_external_tokens: int) -> dict:
        return self.parts[self.main].get_external_cache_hit_sources(request, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        metas = []
        for g, part in enumerate(self.parts):
            so = group_output(scheduler_output, g)
            if self.needs[g].window is not None:
                self._keep_windows(g, so)
            metas.append(part.build_connector_meta(so))
        return GroupsMetadata(tuple(metas))  # type: ignore[arg-type]

    def _keep_windows(self, g: int, so: Any) -> None:
        """A window group stores, of the chunks this step completes, only ``kept_chunks``,
        and never a chunk with a null block: the ones before are marked stored."""
        manager, need, ct = self.parts[g].manager, self.needs[g], self.chunk_tokens
        for s in compat.scheduled_requests(so):
            if s.replace_blocks:  # a whole new table: null before the admitted window
                first_block = need.first_needed_token(s.num_computed_tokens) // self.block_size
                self._floor[s.req_id] = -(-first_block * self.block_size // ct)
            st = manager.state_for(s.req_id)
            keep = need.kept_chunks((s.num_computed_tokens + s.num_scheduled_tokens) // ct, ct)
            st.stored_chunks = max(st.stored_chunks, keep.start, self._floor.get(s.req_id, 0))

    def update_connector_output(self, connector_output: Any) -> None:
        """Every group's, with its own report (None: nothing to report, but the requests
        vLLM got blocks back for still end their holds)."""
        meta = connector_output.kv_connector_worker_meta
        if meta is None and not (
            connector_output.finished_sending or connector_output.finished_recving
        ):
            return
        metas = meta.metas if isinstance(meta, GroupsWorkerMeta) else (None,) * len(self.parts)
        for part, m in zip(self.parts, metas, strict=True):
            part.update_connector_output(
                dataclasses.replace(connector_output, kv_connector_worker_meta=m)
            )

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict | None]:
        raise AssertionError("vLLM calls request_finished_all_groups on a SupportsHMA connector")

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict | None]:
        """Every group's ``request_finished``: True while any group's stores are in flight;
        the params are the full-attention group's, with each group's stored tokens."""
        ids = compat.group_block_ids(block_ids)
        self._floor.pop(request.request_id, None)
        answers = [p.request_finished(request, ids[g]) for g, p in enumerate(self.parts)]
        params = answers[self.main][1] or {}
        stored = [(p or {}).get("miniflex", {}).get("stored_tokens", 0) for _, p in answers]
        params.setdefault("miniflex", {})["stored_tokens_by_group"] = stored
        delay = any(d for d, _ in answers)
        if delay:  # vLLM keeps every group's blocks: counted where counters are reported
            self.parts[self.main].scheduler.hold_blocks(request.request_id)
        return delay, params

    def reset_cache(self) -> bool:
        return all([p.reset_cache() for p in self.parts])

    def take_events(self) -> list[Any]:
        """The full-attention group's tier events (``kv_events.py``); a window group's are
        taken and dropped: it holds windows, not prefixes a router could match."""
        return [p.take_events() for p in self.parts][self.main]

    def has_pending_block_frees(self) -> bool:
        return any(p.has_pending_block_frees() for p in self.parts)

    def has_pending_push_work(self) -> bool:
        return any(p.has_pending_push_work() for p in self.parts)

    @property
    def requires_kv_delivery(self) -> bool:
        return False

    def get_kv_connector_stats(self) -> Any:
        """The full-attention group's counters (the hits vLLM counts); the others' are taken
        and dropped, so that their snapshots keep going."""
        stats = [p.get_kv_connector_stats() for p in self.parts]
        return stats[self.main]

    # ---------------- worker side ----------------
    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        for part, names in zip(self.parts, self.layers, strict=True):
            part.register_kv_caches({n: kv_caches[n] for n in names})

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        assert isinstance(connector_metadata, GroupsMetadata)
        for g, (part, meta) in enumerate(zip(self.parts, connector_metadata.metas, strict=True)):
            part.bind_connector_metadata(meta)
            for job in meta.plan.jobs:
                if job.kind is JobKind.LOAD and not job.synchronous:
                    self._recv_wait[job.req_id].add(g)
            for r in meta.plan.release:
                self._send_wait[r].add(g)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        for part in self.parts:
            part.clear_connector_metadata()

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        assert isinstance(kv_connector_metadata, GroupsMetadata)
        for part, meta in zip(self.parts, kv_connector_metadata.metas, strict=True):
            part.handle_preemptions(meta)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        for part in self.parts:
            part.start_load_kv(forward_context, **kwargs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are asynchronous: done before vLLM schedules the request

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        return  # stores are queued once per step in wait_for_save

    def wait_for_save(self) -> None:
        """Queue every group's stores; a window group's are finished here, before a later
        forward may write its blocks (vLLM frees those that leave the window)."""
        for g, part in enumerate(self.parts):
            part.wait_for_save()
            if self.needs[g].window is not None and part.has_connector_metadata():
                stores = [j for j in part._plan().jobs if j.kind is JobKind.STORE]
                part.handler.wait_for(tuple(j.req_id for j in stores))

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        sending: set[str] = set()
        recving: set[str] = set()
        for g, part in enumerate(self.parts):
            s, r = part.get_finished(finished_req_ids)
            sending |= self._all_reported(self._send_wait, g, s or set())
            recving |= self._all_reported(self._recv_wait, g, r or set())
        return sending or None, recving or None

    @staticmethod
    def _all_reported(waits: dict[str, set[int]], g: int, reported: set[str]) -> set[str]:
        """The requests in ``reported`` (by group ``g``) that no other group still owes."""
        done = set()
        for req_id in reported:
            waits[req_id].discard(g)
            if not waits[req_id]:
                del waits[req_id]
                done.add(req_id)
        return done

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:
        """vLLM 0.30+: ``get_finished``, and the requests whose load failed in any group
        (``failed_recving``). Block ids are unique only within a group, so vLLM refuses
        block-level load errors for several groups (0.31+ raises): a failed load makes
        vLLM recompute the whole request instead. A failure is reported with the request's
        ``finished_recving``, once every group is done writing its blocks."""
        sending, recving = self.get_finished(finished_req_ids)
        self._failed |= set().union(*(p.take_load_failures()[1] for p in self.parts))
        failed = self._failed & (recving or set())
        self._failed -= failed | finished_req_ids  # an aborted request's is moot
        return _RESULTS(sending or set(), recving or set(), failed)  # type: ignore[misc]

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Before vLLM 0.30 (no ``failed_recving``): every group's failed blocks."""
        if _RESULTS is not None:
            return set()  # reported by request in get_transfer_results
        return set().union(*(p.get_block_ids_with_load_errors() for p in self.parts))

    def build_connector_worker_meta(self) -> GroupsWorkerMeta | None:
        metas = tuple(p.build_connector_worker_meta() for p in self.parts)
        return None if all(m is None for m in metas) else GroupsWorkerMeta(metas)  # type: ignore[arg-type]

    def unregister_kv_caches(self) -> None:
        for part in self.parts:
            part.unregister_kv_caches()

    def shutdown(self) -> None:
        for part in self.parts:
            part.shutdown()
