"""The scheduler half of the connector, behind the facade's one-line hooks.

:class:`SchedulerHooks` owns what the scheduler process keeps beside
:class:`~miniflex.scheduler.manager.MiniFlexManager`: vLLM's request objects (for their
block hashes), backfill (who waits for GPU room), the live state (status file and
/metrics levels) and the tier-tagged KV events. Each method is one vLLM scheduler hook,
named as vLLM names it; the facade (``connector.py``) forwards to it, and times it
(``hook_seconds``, which this side reports with each plan).

Block hashes come down with the step: :meth:`build_connector_meta` hands the manager a
read-only view of the requests' hashes (:class:`RequestHashes`), not a way back up.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from miniflex.config import MiniFlexConfig
from miniflex.connector import compat
from miniflex.connector.adapter_keys import chunk_hashes
from miniflex.connector.held_blocks import HeldBlocks
from miniflex.connector.kv_events import TierEvents
from miniflex.connector.live_state import LiveState
from miniflex.connector.metadata import MiniFlexMetadata, MiniFlexWorkerMeta
from miniflex.connector.scheduler_side import recompute_failed_loads, start_manager
from miniflex.connector.vllm_stats import MiniFlexConnectorStats
from miniflex.connector.worker_side import EngineFacts
from miniflex.scheduler.backfill import Backfill
from miniflex.scheduler.lookup import first_chunk_held
from miniflex.scheduler.requests import load_tokens_by_tier
from miniflex.types import ReqId

__all__ = ["RequestHashes", "SchedulerHooks"]

logger = logging.getLogger("miniflex.connector")


class RequestHashes(Mapping[ReqId, Sequence[bytes]]):
    """The block hashes MiniFlex keys each known request's chunks by, read when asked (a
    request's list grows as it decodes; the manager asks only for requests that complete a
    chunk in this step)."""

    def __init__(self, requests: Mapping[ReqId, Any]) -> None:
        self._requests = requests

    def __getitem__(self, req_id: ReqId) -> Sequence[bytes]:
        return chunk_hashes(self._requests[req_id])

    def __iter__(self) -> Iterator[ReqId]:
        return iter(self._requests)

    def __len__(self) -> int:
        return len(self._requests)


class SchedulerHooks:
    """vLLM's scheduler-side connector hooks over one :class:`MiniFlexManager`."""

    def __init__(self, config: MiniFlexConfig, vllm_config: Any, facts: EngineFacts) -> None:
        recompute_failed_loads(vllm_config.kv_transfer_config)
        self.geometry = facts.geometry
        f = facts
        self.manager = start_manager(config, vllm_config, f.geometry, f.ns, f.placement)
        self.backfill = Backfill(config.backfill_s)
        """Who waits for GPU room (``scheduler/backfill.py``)."""
        self.hook_seconds = 0.0
        """Wall time in this side's hooks, not reported yet."""
        self._requests: dict[ReqId, Any] = {}
        self._hashes = RequestHashes(self._requests)
        self._gauges: dict[str, int] = {}  # the levels /metrics has not been sent yet
        self._live = LiveState(config.status_file)
        self._live.start(self.manager.status())
        self._events = TierEvents.for_engine(vllm_config, self.manager, facts.ns)
        self._held = HeldBlocks()  # finished requests whose blocks vLLM keeps for MiniFlex

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

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._requests[request.request_id] = request
        self.backfill.admitted(request.request_id)
        self.manager.on_alloc(
            request.request_id, compat.request_block_ids(blocks), num_external_tokens
        )
        self._events.note(request)

    def get_external_cache_hit_sources(self, request: Any, num_external_tokens: int) -> dict:
        """vLLM 0.32+: the hit by tier (host: CPU, disk: SSD) for its per-source metric."""
        st = self.manager.find_state(request.request_id)
        load = st.load if st is not None else None
        split = load_tokens_by_tier(load, num_external_tokens, self.geometry.chunk_tokens)
        return compat.cache_hit_sources(split)

    def build_connector_meta(self, scheduler_output: Any) -> MiniFlexMetadata:
        scheduled = compat.scheduled_requests(scheduler_output)
        preempted = compat.preempted_ids(scheduler_output)
        plan = self.manager.build_plan(scheduled, preempted, self._hashes)
        self._events.scheduled(scheduled, self._requests)
        self.backfill.end_step()
        self._report_hooks()
        return MiniFlexMetadata(plan)

    def update_connector_output(self, connector_output: Any) -> None:
        if connector_output.finished_sending:  # vLLM frees the blocks it held for stores
            self.backfill.room(len(connector_output.finished_sending))
        freed = (connector_output.finished_sending or set()) | (
            connector_output.finished_recving or set()
        )
        if freed:
            self.manager.stats.add_held(*self._held.released(freed))
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, MiniFlexWorkerMeta):  # each part is often empty: every step
            m = self.manager
            if meta.probes:
                m.on_probes(meta.probes)
            if meta.results:
                m.on_results(meta.results)
            if meta.step_seconds:
                m.on_step_times(meta.step_seconds)
            m.on_clocks(worker_hooks=meta.hook_seconds, thread_cpu=meta.thread_cpu_seconds)
            if meta.puts:
                m.stats.add_puts(meta.puts)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict | None]:
        req_id = request.request_id
        params = self.manager.settle_hits(req_id).finished_params()
        delay = self.manager.on_finished(req_id)
        if delay:
            self.hold_blocks(req_id)
        self.backfill.forget(req_id)
        self._events.forget(req_id)
        if not delay:
            self.backfill.room()
        self._requests.pop(req_id, None)
        self._observe()  # an abort may end the last request between engine steps
        return delay, params

    def hold_blocks(self, req_id: ReqId) -> None:
        """vLLM keeps finished ``req_id``'s blocks for MiniFlex from now until a worker
        reports it finished-sending or finished-receiving (timed: ``held_blocks.py``)."""
        self._held.hold(req_id)

    def may_load_async(self, request: Any) -> bool:
        """Whether the request may load a hit asynchronously: a tier holds its first chunk,
        or a remote store may."""
        m = self.manager
        return first_chunk_held(m.ns, m.tiers, m.remote is not None, chunk_hashes(request))

    def take_events(self) -> list[Any]:
        """vLLM's KV events for the chunks MiniFlex's tiers gained and lost."""
        return self._events.take()

    def reset_cache(self) -> bool:
        """Forget every chunk in every tier (logged with the number dropped); True."""
        logger.info("MiniFlex cache reset: %d chunks dropped", self.manager.reset())
        return True

    def has_pending_block_frees(self) -> bool:
        return self.manager.has_pending_frees()

    def has_pending_push_work(self) -> bool:
        """Step on while jobs are in flight (their results arrive), and once more after a
        request ended between steps with levels /metrics has not been sent."""
        return self.manager.has_jobs() or bool(self._gauges)

    def get_kv_connector_stats(self) -> MiniFlexConnectorStats | None:
        """After each step: counters since the last call, and levels (``now_*``) if fresh."""
        m = self.manager
        counters = {} if m.stats.is_empty() else m.take_stats().as_counters()
        self._observe()
        gauges, self._gauges = self._gauges, {}
        if not counters and not gauges:
            return None
        return MiniFlexConnectorStats(data={**counters, **gauges})

    def shutdown(self) -> None:
        self._report_hooks()
        if self.manager.remote is not None:
            self.manager.remote.close()
        self._live.close(self.manager.status())  # the final state

    def _report_hooks(self) -> None:
        hooks, self.hook_seconds = self.hook_seconds, 0.0
        self.manager.on_clocks(scheduler_hooks=hooks)

    def _observe(self) -> None:
        """Snapshot the state when due (see ``live_state.py``); keep its levels for /metrics."""
        m = self.manager
        busy = bool(self._requests) or m.has_jobs() or m.has_pending_frees()
        gauges = self._live.observe(busy, m.status)
        if gauges is not None:
            self._gauges = gauges
