"""``MiniFlexConnector``: the vLLM V1 KV connector, a facade over two halves.

Load it with::

    --kv-transfer-config '{"kv_connector": "MiniFlexConnector",
                           "kv_connector_module_path": "miniflex.connector",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"cpu_bytes": "8GiB"}}'

Each hook forwards to one half, in one line where vLLM's base class asks nothing more:
in the scheduler process
:class:`~miniflex.connector.scheduler_hooks.SchedulerHooks` (the manager, vLLM's request
objects, backfill, the status file, KV events), in each worker
:class:`~miniflex.worker.step_driver.StepDriver` (one engine step, over this rank's
:class:`MiniFlexHandler`). The facade holds no state of its own beyond what it learns of
the engine at start (:class:`~miniflex.connector.worker_side.EngineFacts`). The two
halves exchange only :class:`MiniFlexMetadata` (a frozen ``TransferPlan``, going down) and
:class:`MiniFlexWorkerMeta` (``JobResult``s, coming back).
"""

from __future__ import annotations

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
from miniflex.connector.metadata import MiniFlexMetadata, MiniFlexWorkerMeta
from miniflex.connector.model_kinds import check_stateless, geometry_for
from miniflex.connector.prom import MiniFlexPromMetrics
from miniflex.connector.scheduler_hooks import SchedulerHooks
from miniflex.connector.vllm_stats import MiniFlexConnectorStats
from miniflex.connector.worker_side import EngineFacts, open_worker, register_kv_caches
from miniflex.errors import ConfigError
from miniflex.keys import Namespace, namespace_for
from miniflex.layout import KVGeometry
from miniflex.plan import TransferPlan
from miniflex.ranks import TPPlacement
from miniflex.scheduler.manager import MiniFlexManager
from miniflex.worker.handler import MiniFlexHandler
from miniflex.worker.step_driver import StepDriver

if TYPE_CHECKING:
    from vllm.v1.outputs import KVConnectorOutput

__all__ = ["MiniFlexConnector"]


class MiniFlexConnector(KVConnectorBase_V1):
    """Tiered KV cache (pinned CPU, optional SSD) behind vLLM's V1 connector API."""

    _cache_hit_source = compat.hit_source("host")  # vLLM 0.32+; per hit: the hook below

    def __init__(
        self,
        vllm_config: Any,
        role: KVConnectorRole,
        kv_cache_config: Any = None,
        config: MiniFlexConfig | None = None,
        kv_group: str = "",
    ):
        """``config``: MiniFlex's settings (None: read from ``kv_connector_extra_config``);
        ``kv_group``: the hybrid model's KV cache group served (``Namespace.kv_group``)."""
        compat.quiet_connector_notice()
        super().__init__(vllm_config, role, kv_cache_config)
        compat.share_vllm_logging()
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.config = config if config is not None else MiniFlexConfig.from_dict(extra)
        self.facts = _engine_facts(self.config, vllm_config, kv_cache_config, role, kv_group)
        self._scheduler: SchedulerHooks | None = None
        self._step: StepDriver | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerHooks(self.config, vllm_config, self.facts)
        else:
            self._step = open_worker(self.config, self.facts)

    @property
    def geometry(self) -> KVGeometry:
        return self.facts.geometry

    @property
    def ns(self) -> Namespace:
        return self.facts.ns

    @property
    def hook_seconds(self) -> float:
        """Wall time in this side's hooks, not reported yet (``timed_hook`` adds to it)."""
        return self._side.hook_seconds

    @hook_seconds.setter
    def hook_seconds(self, seconds: float) -> None:
        self._side.hook_seconds = seconds

    @property
    def _side(self) -> SchedulerHooks | StepDriver:
        side = self._scheduler if self._scheduler is not None else self._step
        assert side is not None
        return side

    # ---------------- worker side: worker/step_driver.py says what each step does ----------
    @property
    def step(self) -> StepDriver:
        assert self._step is not None, "worker-side call on the scheduler connector"
        return self._step

    @property
    def handler(self) -> MiniFlexHandler:
        return self.step.handler

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        register_kv_caches(self.step, self.config, self.facts, kv_caches)

    def _plan(self) -> TransferPlan:
        meta = self._get_connector_metadata()
        assert isinstance(meta, MiniFlexMetadata)
        return meta.plan

    def _plan_or_none(self) -> TransferPlan | None:
        return self._plan() if self.has_connector_metadata() else None

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
        return self.step.load_errors()[0]

    def take_load_failures(self) -> tuple[set[int], set[str]]:
        """Not a vLLM hook: what ``get_block_ids_with_load_errors`` would return, and the
        requests of those blocks (a facade over several KV cache groups reports requests)."""
        return self.step.load_errors()

    @timed_hook
    def build_connector_worker_meta(self) -> MiniFlexWorkerMeta | None:
        return MiniFlexWorkerMeta.of(self.step.report())

    @timed_hook
    def unregister_kv_caches(self) -> None:
        """vLLM 0.33+, before sleep mode unmaps the KV cache (waking maps the same addresses)."""
        self.handler.drain()

    def shutdown(self) -> None:
        HOOKS.log_summary()
        self._side.shutdown()

    # ---------------- scheduler side: connector/scheduler_hooks.py ----------------
    @property
    def scheduler(self) -> SchedulerHooks:
        assert self._scheduler is not None, "scheduler-side call on a worker connector"
        return self._scheduler

    @property
    def manager(self) -> MiniFlexManager:
        return self.scheduler.manager

    @timed_hook
    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self.scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    @timed_hook
    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self.scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    @timed_hook
    def get_external_cache_hit_sources(self, request: Any, num_external_tokens: int) -> dict:
        return self.scheduler.get_external_cache_hit_sources(request, num_external_tokens)

    @timed_hook
    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return self.scheduler.build_connector_meta(scheduler_output)

    @timed_hook
    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self.scheduler.update_connector_output(connector_output)

    @timed_hook
    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict | None]:
        return self.scheduler.request_finished(request, block_ids)

    def may_load_async(self, request: Any) -> bool:
        """vLLM 0.34+ (``--max-num-inflight-kv-loads``)."""
        return self.scheduler.may_load_async(request)

    def take_events(self) -> list[Any]:
        return self.scheduler.take_events()

    def reset_cache(self) -> bool:
        """``reset_prefix_cache(reset_connector=True)``: forget every chunk in every tier.

        The SSD store forgets its chunks durably too (a reset usually means new weights),
        in order with the transfers already queued."""
        return self.scheduler.reset_cache()

    @timed_hook
    def has_pending_block_frees(self) -> bool:
        return self.scheduler.has_pending_block_frees()

    @timed_hook
    def has_pending_push_work(self) -> bool:
        return self.scheduler.has_pending_push_work()

    @timed_hook
    def get_kv_connector_stats(self) -> MiniFlexConnectorStats | None:
        return self._scheduler.get_kv_connector_stats() if self._scheduler is not None else None

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


def _engine_facts(
    config: MiniFlexConfig,
    vllm_config: Any,
    kv_cache_config: Any,
    role: KVConnectorRole,
    kv_group: str,
) -> EngineFacts:
    """What both halves plan for, checked before anything is allocated or started."""
    if kv_cache_config is None:
        raise ConfigError("kv_cache_config", None, "vLLM 0.26 or newer passes it to connectors")
    geometry = geometry_for(
        compat.engine_layout(vllm_config),
        kv_cache_config,
        config.chunk_blocks,
        compat.hash_block_size(kv_cache_config),
    )
    placement = TPPlacement(compat.tp_size(vllm_config), replicated=geometry.latent)
    if role == KVConnectorRole.WORKER:
        preflight.check_worker(config, geometry, compat.tp_rank(), placement)
    preflight.check_cpu_bytes(config, geometry, placement)
    # a latent cache has one head: its page is the same bytes in either order
    page_order = "LBHNC" if geometry.latent else compat.page_order(kv_cache_config)
    ns = namespace_for(
        compat.model_name(vllm_config),
        geometry,
        page_order,
        placement.tp_size,
        placement.replicated,
        compat.model_digest(vllm_config),
        kv_group,
    )
    num_slots = placement.per_store(config.cpu_bytes) // geometry.slot_bytes
    return EngineFacts(
        geometry, placement, page_order, ns, num_slots, compat.engine_id(vllm_config)
    )
