"""The scheduler half's start: its tiers, sized from the config and seeded from the SSD stores.

vLLM builds the workers' KV caches (which opens their SSD stores and repairs
their journals) before the scheduler's connector, so the stores' journals are
the truth by the time this runs.
"""

from __future__ import annotations

import logging
from typing import Any

from miniflex.config import MiniFlexConfig, hash_seed_set
from miniflex.connector import compat
from miniflex.keys import Namespace
from miniflex.layout import KVGeometry
from miniflex.pool import stream_slots
from miniflex.ranks import TPPlacement
from miniflex.remote import tier as remote_tier
from miniflex.scheduler import ssd_tier
from miniflex.scheduler.manager import MiniFlexManager

__all__ = ["recompute_failed_loads", "start_manager"]

logger = logging.getLogger("miniflex.connector")


def recompute_failed_loads(kv_transfer_config: Any) -> None:
    """A cache miss must never fail a request: vLLM recomputes what could not be loaded."""
    if kv_transfer_config.kv_load_failure_policy != "recompute":
        logger.info("MiniFlex sets kv_load_failure_policy=recompute")
        kv_transfer_config.kv_load_failure_policy = "recompute"


def start_manager(
    config: MiniFlexConfig,
    vllm_config: Any,
    geometry: KVGeometry,
    ns: Namespace,
    placement: TPPlacement,
) -> MiniFlexManager:
    """The engine's :class:`MiniFlexManager`: ``cpu_bytes`` and ``ssd_bytes`` are the
    engine's, split over ``placement``'s pools and stores (each has the slots it has).
    The remote store is checked first: bad credentials fail before anything slow is built."""
    remote = remote_tier.open_lookup(config, ns, placement)
    num_slots = placement.per_store(config.cpu_bytes) // geometry.slot_bytes
    ssd_slots = ssd_tier.num_slots(config, geometry.slot_bytes, placement)
    manager = MiniFlexManager(
        config,
        ns,
        num_slots,
        compat.reporting_workers(vllm_config),
        ssd_slots,
        geometry.chunk_bytes,
        compat.step_tokens(vllm_config),
        compat.graph_rule(vllm_config),
        compat.max_model_len(vllm_config),
        remote,
        stream_slots(config, geometry.slot_bytes, placement),
    )
    recovered = ssd_tier.seed(manager, config, geometry, ns, placement)
    if (ssd_slots or remote) and not compat.block_hashes_reproducible(hash_seed_set()):
        logger.warning(
            "vLLM seeds its block hashes randomly in each process, so chunks on SSD or in "
            "the remote store will not be found after a restart or by another replica; set "
            "PYTHONHASHSEED (any value, the same for every start and replica) to keep them"
        )
    logger.info(
        "MiniFlex scheduler: %d CPU slots x %d tokens (%.2f GiB in %d pool(s)), %d SSD slots "
        "(%d chunks recovered), remote %s, namespace %s",
        num_slots,
        geometry.chunk_tokens,
        num_slots * geometry.slot_bytes * placement.stores / 2**30,
        placement.stores,
        ssd_slots,
        recovered,
        remote.stores[0].url if remote is not None else "none",
        ns.key_digest.hex()[:12],
    )
    return manager
