"""Helpers for running vLLM's offline ``LLM`` with MiniFlex (demo, benchmarks, tests)."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

from miniflex.config import MiniFlexConfig
from miniflex.connector.preflight import EngineArgs, check_before_start
from miniflex.errors import MiniFlexError

__all__ = [
    "evict_gpu_prefix_cache",
    "make_llm",
    "miniflex_declined_tokens",
    "miniflex_hit_tokens",
    "miniflex_hits_by_tier",
    "miniflex_resident_by_tier",
    "shutdown_llm",
]

CONNECTOR = {
    "kv_connector": "MiniFlexConnector",
    "kv_connector_module_path": "miniflex.connector",
    "kv_role": "kv_both",
}


def make_llm(
    model: Path | str,
    miniflex: dict[str, Any] | None,
    *,
    connector: str = "MiniFlexConnector",
    **engine_args: Any,
) -> Any:
    """An ``LLM`` for token-id prompts (no tokenizer), eager, bf16; ``miniflex=None``: APC only.

    ``connector``: ``MiniFlexHMAConnector`` keeps vLLM's hybrid KV cache manager on.

    ``engine_args`` go to ``vllm.LLM`` and override these defaults, e.g.
    ``kv_cache_memory_bytes`` (CPU) or ``num_gpu_blocks_override`` (GPU). The
    MiniFlex settings are checked against the model and the machine first
    (``connector/preflight.py``), so a bad one is a ConfigError before vLLM starts.
    """
    args: dict[str, Any] = {
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "max_num_seqs": 4,
        "enforce_eager": True,
        "seed": 0,
        **engine_args,
    }
    kv = None
    if miniflex is not None:
        engine = EngineArgs(
            args.get("block_size"),
            int(args.get("tensor_parallel_size") or 1),
            str(args["dtype"]),
            str(args.get("kv_cache_dtype") or "auto"),
        )
        check_before_start(str(model), MiniFlexConfig.from_dict(miniflex), engine)
        if connector == CONNECTOR["kv_connector"]:  # one KV cache group
            args.setdefault("disable_hybrid_kv_cache_manager", True)
    from vllm import LLM
    from vllm.config import KVTransferConfig

    if miniflex is not None:
        kv = KVTransferConfig(
            **{**CONNECTOR, "kv_connector": connector}, kv_connector_extra_config=miniflex
        )
    return LLM(model=str(model), kv_transfer_config=kv, **args)


def evict_gpu_prefix_cache(llm: Any, timeout_s: float = 30.0) -> None:
    """Drop vLLM's own prefix cache (the "GPU" copy), so the next hit must come from MiniFlex.

    A request returns to the caller before MiniFlex has finished saving its
    blocks, and vLLM refuses to reset while those blocks are held; retry
    until the saves are done.
    """
    deadline = time.monotonic() + timeout_s
    while not llm.reset_prefix_cache():
        if time.monotonic() > deadline:
            raise MiniFlexError(f"vLLM's prefix cache could not be reset within {timeout_s} s")
        time.sleep(0.02)


def miniflex_hit_tokens(output: Any) -> int | None:
    """Tokens of a finished request that MiniFlex loaded (None: MiniFlex not configured)."""
    params = _params(output)
    return None if params is None else int(params["hit_tokens"])


def miniflex_hits_by_tier(output: Any) -> dict[str, int]:
    """Tokens MiniFlex loaded for a finished request, per tier (``{"cpu": .., "ssd": ..}``)."""
    return _per_tier(output, "hit_tokens_")


def miniflex_resident_by_tier(output: Any) -> dict[str, int]:
    """Tokens MiniFlex held for a finished request at its last lookup, per tier, from the
    start of the chunk holding vLLM's own hit; the last chunk counts up to the prompt's end."""
    return _per_tier(output, "resident_tokens_")


def miniflex_declined_tokens(output: Any) -> int:
    """Tokens of a finished request that MiniFlex held and its cost model chose to recompute."""
    return int((_params(output) or {}).get("declined_tokens", 0))


def _per_tier(output: Any, prefix: str) -> dict[str, int]:
    params = _params(output) or {}
    return {k[len(prefix) :]: int(v) for k, v in params.items() if k.startswith(prefix)}


def _params(output: Any) -> dict[str, Any] | None:
    """MiniFlex's part of a finished request's ``kv_transfer_params`` (None: none)."""
    return (output.kv_transfer_params or {}).get("miniflex")


def shutdown_llm(llm: Any) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
