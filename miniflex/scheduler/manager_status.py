"""The scheduler's state as a plain dict: ``miniflex inspect``'s view and the status file."""

from __future__ import annotations

from collections.abc import Sized
from typing import Any, Protocol

from miniflex.config import MiniFlexConfig
from miniflex.cost import CostModel
from miniflex.keys import Namespace
from miniflex.remote.lookup import RemoteLookup
from miniflex.stats import TransferStats
from miniflex.tiers import SlotTier, TierStack

__all__ = ["StatusSource", "manager_status"]


class StatusSource(Protocol):
    """What the status reads of the manager (:class:`~miniflex.scheduler.manager.MiniFlexManager`
    is one), named here so that this module does not import it."""

    config: MiniFlexConfig
    ns: Namespace
    cost: CostModel
    remote: RemoteLookup | None
    tiers: TierStack
    jobs: Sized
    totals: TransferStats
    stats: TransferStats

    @property
    def cpu(self) -> SlotTier: ...

    @property
    def ssd(self) -> SlotTier | None: ...

    @property
    def num_requests(self) -> int: ...


def manager_status(m: StatusSource) -> dict[str, Any]:
    """Tiers, the cost model and cumulative counters of ``m``."""
    tiers = [m.cpu.usage()] + ([m.ssd.usage()] if m.ssd is not None else [])
    return {
        "namespace": m.ns.digest.hex(),
        "chunk_tokens": m.ns.chunk_tokens,
        "tiers": [
            {
                "tier": u.tier.name.lower(),
                "slots": u.num_slots,
                "resident": u.resident,
                "pinned_or_moving": u.pinned_or_moving,
                "free": u.free,
                "evictions": u.evictions,
            }
            for u in tiers
        ],
        "cost_model": _cost_model(m),
        "remote": m.remote.status() if m.remote is not None else None,
        "requests_tracked": m.num_requests,
        "jobs_in_flight": len(m.jobs),
        "ssd_write_backlog": m.tiers.write_backlog,
        "totals": TransferStats().merge(m.totals).merge(m.stats).as_counters(),
    }


def _cost_model(m: StatusSource) -> dict[str, Any]:
    cost = m.cost
    prefill = cost.prefill
    return {
        "hit_policy": m.config.hit_policy,
        "calibrated": cost.calibrated,
        "ssd_admits": m.tiers.ssd_admits if m.ssd is not None else None,
        "observed_steps": cost.observed_steps,
        "load_GBps": {t.name.lower(): bw / 1e9 for t, bw in cost.bandwidth.items()},
        "layerwise_load_GBps": None
        if cost.layerwise_bandwidth is None
        else cost.layerwise_bandwidth / 1e9,
        "prefill": None
        if prefill is None
        else {
            "step_s": prefill.step,
            "per_token_s": prefill.per_token,
            "per_pair_s": prefill.per_pair,
        },
    }
