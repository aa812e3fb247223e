"""``MiniFlexConnector``: the vLLM V1 KV connector, a facade over two halves.

Load it with::

    --kv-transfer-config '{"kv_connector": "MiniFlexConnector",
                           "kv_connector_module_path": "miniflex.connector",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"cpu_bytes": "8GiB"}}'

In the scheduler process it forwards to :class:`MiniFlexManager`; in each
worker to :class:`MiniFlexHandler`. The two exchange only
:class:`MiniFlexMetadata` (a frozen ``TransferPlan``, going down) and
:class:`MiniFlexWorkerMeta` (``JobResult``s, coming back).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from miniflex.clocks import HOOKS, timed_hook
from miniflex.config import MiniFlexConfig
from miniflex.connector import compat, preflight
from miniflex.connector.adapter_keys import chunk_hashes
from miniflex.connector.kv_events import TierEvents
from miniflex.connector.live_state import LiveState
from miniflex.connector.metadata import MiniFlexMetadata, MiniFlexWorkerMeta
from miniflex.connector.model_kinds import check_stateless, geometry_for
from miniflex.connector.prom import MiniFlexPromMetrics
from miniflex.connector.scheduler_side import recompute_failed_loads, start_manager
from miniflex.connector.vllm_stats import MiniFlexConnectorStats
from miniflex.errors import ConfigError, TransferError
from miniflex.keys import namespace_for
from miniflex.plan import TransferPlan
from miniflex.ranks import RankSetup, TPPlacement
from miniflex.remote.tier import WorkerRemote
from miniflex.scheduler.backfill import Backfill
from miniflex.scheduler.hits import load_tokens_by_tier
from miniflex.scheduler.lookup import first_chunk_held
from miniflex.scheduler.manager import MiniFlexManager
from miniflex.shared_pool import shared_pool_path
from miniflex.types import ReqId
from miniflex.worker.handler import MiniFlexHandler
from miniflex.worker.step_driver import StepDriver

if TYPE_CHECKING:
    from vllm.v1.outputs import KVConnectorOutput

__all__ = ["MiniFlexConnector"]

logger = logging.getLogger("miniflex.connector")


class MiniFlexConnector(KVConnectorBase_V1):
    """Tiered KV cache (pinned CPU, optional SSD) behind vLLM's V1 connector API."""

    _cache_hit_source = compat.hit_source("host")  # vLLM 0.32+; per hit: the hook below

    def __init__(
        self,
        vllm_config: Any,
        role: KVConnectorRole,
        kv_cache_config: Any = None,
        config: MiniFlexConfig | None = None,
    ):
        """``config``: MiniFlex's settings (None: read from ``kv_connector_extra_config``)."""
        compat.quiet_connector_notice()
        super().__init__(vllm_config, role, kv_cache_config)
        compat.share_vllm_logging()
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.config = config if config is not None else MiniFlexConfig.from_dict(extra)
        if kv_cache_config is None:
            raise ConfigError("kv_cache_config", None, "vLLM 0.26 or newer passes it to connectors")
        geometry = geometry_for(
            compat.engine_layout(vllm_config),
            kv_cache_config,
            self.config.chunk_blocks,
            compat.hash_block_size(kv_cache_config),
        )
        self.geometry = geometry
        self.placement = TPPlacement(compat.tp_size(vllm_config), replicated=geometry.latent)
        if role == KVConnectorRole.WORKER:  # before anything is allocated or created
            preflight.check_worker(self.config, geometry, compat.tp_rank(), self.placement)
        preflight.check_cpu_bytes(self.config, geometry, self.placement)
        self.num_slots = self.placement.per_store(self.config.cpu_bytes) // geometry.slot_bytes
        # a latent cache has one head: its page is the same bytes in either order
        self.page_order = "LBHNC" if geometry.latent else compat.page_order(kv_cache_config)
        self.engine_id = compat.engine_id(vllm_config)
        self.ns = namespace_for(
            compat.model_name(vllm_config),
            geometry,
            self.page_order,
            self.placement.tp_size,
            self.placement.replicated,
            compat.model_digest(vllm_config),
        )
        self._manager: MiniFlexManager | None = None
        self._handler: MiniFlexHandler | None = None
        self._requests: dict[ReqId, Any] = {}
        self._live: LiveState | None = None  # scheduler: status file and /metrics levels
        self._events: TierEvents  # scheduler: tier-tagged KV events (kv_events.py)
        self._gauges: dict[str, int] = {}  # the levels /metrics has not been sent yet
        self.hook_seconds = 0.0  # wall time in this side's hooks, not reported yet
        self.backfill = Backfill(self.config.backfill_s)  # scheduler: who waits for room
        self._step: StepDriver | None = None  # worker: the hooks of one engine step
        if role == KVConnectorRole.SCHEDULER:
            self._start_scheduler_side(vllm_config)
        else:
            self._start_worker_side()

    def _start_scheduler_side(self, vllm_config: Any) -> None:
        recompute_failed_loads(self._kv_transfer_config)
        self._manager = start_manager(
            self.config, vllm_config, self.geometry, self.ns, self.placement
        )
        self._live = LiveState(self.config.status_file)
        self._live.start(self._manager.status())
        self._events = TierEvents.for_engine(vllm_config, self._manager, self.ns)

    def _start_worker_side(self) -> None:
        rank = compat.tp_rank()
        writes = self.placement.writes(rank)  # the store is checked before vLLM allocates
        remote = WorkerRemote.open(self.config, self.ns.shard(rank).digest) if writes else None
        self._handler = MiniFlexHandler(self.config, remote)
        self._step = StepDriver(self._handler)

    # ---------------- worker side ----------------
    @property
    def handler(self) -> MiniFlexHandler:
        assert self._handler is not None, "worker-side call on the scheduler connector"
        return self._handler

    @property
    def step(self) -> StepDriver:
        assert self._step is not None, "worker-side call on the scheduler connector"
        return self._step

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        rank = compat.tp_rank()
        shared = self.placement.shared_pool
        pool = shared_pool_path(self.engine_id, self.config.cpu_pool_file) if shared else None
        setup = RankSetup(rank, self.placement, self.ns.shard(rank).digest, pool)
        layout = self.handler.register(
            kv_caches, self.num_slots, self.geometry.blocks_per_chunk, setup, self.geometry.latent
        )
        if layout.geometry != self.geometry or layout.order != self.page_order:
            raise TransferError(
                f"KV tensors ({layout.order}, {layout.geometry}) differ from what the scheduler "
                f"planned for ({self.page_order}, {self.geometry})"
            )

    def _plan(self) -> TransferPlan:
        meta = self._get_connector_metadata()
        assert isinstance(meta, MiniFlexMetadata)
        return meta.plan

    def _plan_or_none(self) -> TransferPlan | None:
        return self._plan() if self.has_connector_metadata() else None

    # Each worker hook is one step of worker/step_driver.py, which says what and why.
    @timed_hook
    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._step is not None and isinstance(connector_metadata, MiniFlexMetadata):
            self._step.bound(connector_metadata.plan)

    @timed_hook
    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if isinstance(kv_connector_metadata, MiniFlexMetadata):
            self.step.preempted(kv_connector_metadata.plan)

    @timed_hook
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self.step.before_forward(self._plan())

    @timed_hook
    def wait_for_layer_load(self, layer_name: str) -> None:
        self.step.layer(layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return  # stores are queued once per step in wait_for_save

    @timed_hook
    def wait_for_save(self) -> None:
        self.step.after_forward(self._plan_or_none())

    @timed_hook
    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self.step.finished(self._plan_or_none())

    @timed_hook
    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.step.load_errors()

    @timed_hook
    def build_connector_worker_meta(self) -> MiniFlexWorkerMeta | None:
        report = self.step.report(self.hook_seconds)
        if report is not None:
            self.hook_seconds = 0.0
        return MiniFlexWorkerMeta(*report) if report is not None else None

    @timed_hook
    def unregister_kv_caches(self) -> None:
        """vLLM 0.33+, before sleep mode unmaps the KV cache (waking maps the same addresses)."""
        self.handler.drain()

    def shutdown(self) -> None:
        summary = HOOKS.summary()
        if summary:
            logger.info("MiniFlex hooks (calls/total/longest): %s", summary)
        if self._handler is not None:
            self._handler.shutdown()
        if self._manager is not None:
            self._report_scheduler_hooks()
            if self._manager.remote is not None:
                self._manager.remote.close()
        if self._live is not None:
            self._live.close(self.manager.status())  # the final state

    # ---------------- scheduler side ----------------
    @property
    def manager(self) -> MiniFlexManager:
        assert self._manager is not None, "scheduler-side call on a worker connector"
        return self._manager

    def _report_scheduler_hooks(self) -> None:
        hooks, self.hook_seconds = self.hook_seconds, 0.0
        self.manager.on_clocks(scheduler_hooks=hooks)

    @timed_hook
    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """None: vLLM asks again later (a chunk lands on SSD, or ``backfill.py`` passes)."""
        req_id, bs = request.request_id, self.geometry.block_size
        need = -(-request.num_tokens // bs) - num_computed_tokens // bs  # GPU blocks it takes
        if self.backfill.passes_over(req_id, need):
            self.manager.stats.backfill_passes += 1
            return None, False
        self._requests[req_id] = request
        hit = self.manager.lookup(
            req_id, chunk_hashes(request), request.num_tokens, num_computed_tokens
        )
        if hit.tokens is None:
            return None, False
        self.backfill.asked(req_id, need)
        return hit.tokens, hit.tokens > 0 and hit.load_async

    @timed_hook
    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._requests[request.request_id] = request
        self.backfill.admitted(request.request_id)
        self.manager.on_alloc(
            request.request_id, compat.request_block_ids(blocks), num_external_tokens
        )
        self._events.note(request)

    @timed_hook
    def get_external_cache_hit_sources(self, request: Any, num_external_tokens: int) -> dict:
        """vLLM 0.32+: the hit by tier (host: CPU, disk: SSD) for its per-source metric."""
        st = self.manager.find_state(request.request_id)
        load = st.load if st is not None else None
        split = load_tokens_by_tier(load, num_external_tokens, self.geometry.chunk_tokens)
        return compat.cache_hit_sources(split)

    @timed_hook
    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        scheduled = compat.scheduled_requests(scheduler_output)
        plan = self.manager.build_plan(
            scheduled, compat.preempted_ids(scheduler_output), self._block_hashes
        )
        self._events.scheduled(scheduled, self._requests)
        self.backfill.end_step()
        self._report_scheduler_hooks()
        return MiniFlexMetadata(plan)

    def _block_hashes(self, req_id: ReqId) -> Sequence[bytes] | None:
        request = self._requests.get(req_id)
        return chunk_hashes(request) if request is not None else None

    @timed_hook
    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        if connector_output.finished_sending:  # vLLM frees the blocks it held for stores
            self.backfill.room(len(connector_output.finished_sending))
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, MiniFlexWorkerMeta):  # each part is often empty: every step
            if meta.probes:
                self.manager.on_probes(meta.probes)
            if meta.results:
                self.manager.on_results(meta.results)
            if meta.step_seconds:
                self.manager.on_step_times(meta.step_seconds)
            self.manager.on_clocks(
                worker_hooks=meta.hook_seconds, thread_cpu=meta.thread_cpu_seconds
            )

    @timed_hook
    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict | None]:
        req_id = request.request_id
        params = self.manager.settle_hits(req_id).finished_params()
        delay = self.manager.on_finished(req_id)
        self.backfill.forget(req_id)
        self._events.forget(req_id)
        if not delay:
            self.backfill.room()
        self._requests.pop(req_id, None)
        self._observe()  # an abort may end the last request between engine steps
        return delay, params

    def may_load_async(self, request: Any) -> bool:
        """vLLM 0.34+ (``--max-num-inflight-kv-loads``): whether the request may load a hit
        asynchronously: a tier holds its first chunk, or a remote store may."""
        m = self.manager
        return first_chunk_held(m.ns, m.tiers, m.remote is not None, chunk_hashes(request))

    def take_events(self) -> list[Any]:
        """vLLM's KV events for the chunks MiniFlex's tiers gained and lost (``kv_events.py``)."""
        return self._events.take()

    def reset_cache(self) -> bool:
        """``reset_prefix_cache(reset_connector=True)``: forget every chunk in every tier.

        The SSD store forgets its chunks durably too (a reset usually means new weights),
        in order with the transfers already queued."""
        dropped = self.manager.reset()
        logger.info("MiniFlex cache reset: %d chunks dropped", dropped)
        return True

    @timed_hook
    def has_pending_block_frees(self) -> bool:
        return self.manager.has_pending_frees()

    @timed_hook
    def has_pending_push_work(self) -> bool:
        """Step on while jobs are in flight (their results arrive), and once more after a
        request ended between steps with levels /metrics has not been sent."""
        return self.manager.has_jobs() or bool(self._gauges)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a store dropped by preemption is only a future miss

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """Never: vLLM keeps its full CUDA graphs; an in-step load never relies on the layer
        hook in a step that may replay one (``scheduler/cuda_graphs.py``)."""
        MiniFlexConfig.from_dict(extra_config)  # a bad setting fails here, before vLLM starts
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> str | None:
        # Called before vLLM groups the layers: refuse Mamba models with MiniFlex's reason.
        check_stateless(compat.model_name(vllm_config), compat.state_model(vllm_config))
        return "HND"  # LBHNC pages: valid on every supported version and the CPU backend

    def _observe(self) -> None:
        """Snapshot the state when due (see ``live_state.py``); keep its levels for /metrics."""
        m = self.manager
        busy = bool(self._requests) or m.has_jobs() or m.has_pending_frees()
        assert self._live is not None
        gauges = self._live.observe(busy, m.status)
        if gauges is not None:
            self._gauges = gauges

    @timed_hook
    def get_kv_connector_stats(self) -> MiniFlexConnectorStats | None:
        """After each step: counters since the last call, and levels (``now_*``) if fresh."""
        m = self._manager
        if m is None:
            return None
        counters = {} if m.stats.is_empty() else m.take_stats().as_counters()
        self._observe()
        gauges, self._gauges = self._gauges, {}
        if not counters and not gauges:
            return None
        return MiniFlexConnectorStats(data={**counters, **gauges})

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> MiniFlexPromMetrics:
        return MiniFlexPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> MiniFlexConnectorStats:
        return MiniFlexConnectorStats(data=dict(data or {}))
