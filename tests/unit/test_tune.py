"""Tuning without a GPU: model geometry, synthetic caches, choosing the winner, the CLI."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from miniflex.errors import ConfigError
from miniflex.gpu.kernel_mover import DEFAULT_CTAS
from miniflex.gpu.synthetic import kv_geometry, load_model_config, random_chunks, synthetic_caches
from miniflex.layout import layout_from_tensors
from miniflex.tools.cli import main
from miniflex.tools.table import format_table
from miniflex.tools.tune import Candidate, Timing, pick_winner

QWEN = Path(__file__).parents[2] / "bench" / "models" / "qwen3-8b-shape"


def test_geometry_of_qwen3_8b_from_its_config() -> None:
    g = kv_geometry(load_model_config(QWEN), 16, "bfloat16", 64)
    assert (g.num_layers, g.num_kv_heads, g.head_size, g.blocks_per_chunk) == (36, 8, 128, 4)
    assert g.page_bytes == 64 * 1024 and g.chunk_bytes == 36 * 4 * 64 * 1024
    assert kv_geometry(load_model_config(QWEN / "config.json"), 16, "fp8", 64, 2).num_kv_heads == 4


def test_head_size_falls_back_to_hidden_over_heads() -> None:
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 16, "hidden_size": 2048}
    g = kv_geometry(cfg, 32, "float16", 64)
    assert (g.num_kv_heads, g.head_size, g.itemsize, g.blocks_per_chunk) == (16, 128, 2, 2)


@pytest.mark.parametrize(
    ("cfg", "args", "match"),
    [
        ({"num_hidden_layers": 2}, (16, "bfloat16", 64), "num_attention_heads"),
        (
            {"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8},
            (16, "int3", 64),
            "dtype",
        ),
        (
            {"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8},
            (16, "bf16", 40),
            "multiple",
        ),
    ],
)
def test_bad_model_settings_are_config_errors(cfg, args, match) -> None:
    with pytest.raises(ConfigError, match=match):
        kv_geometry(cfg, *args)


def test_missing_model_config_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config\.json"):
        load_model_config(tmp_path)


@pytest.mark.parametrize("order", ["LBNHC", "LBHNC"])
def test_synthetic_caches_look_like_vllm_caches(order) -> None:
    g = kv_geometry({"num_hidden_layers": 3, "num_attention_heads": 2, "head_dim": 8}, 4, "bf16", 8)
    kv = synthetic_caches(g, order, 10, "cpu", pad_bytes=32)
    layout = layout_from_tensors(kv, g.blocks_per_chunk)
    assert layout.order == order and layout.geometry == g
    assert layout.block_stride == g.page_bytes + 32 and layout.num_blocks == 10


def test_random_chunks_use_distinct_blocks_and_slots() -> None:
    chunks = random_chunks(8, 4, 40, 10, random.Random(0))
    blocks = [b for c in chunks for b in c.block_ids]
    assert len(set(blocks)) == 32 and len({c.slot for c in chunks}) == 8
    assert blocks != sorted(blocks)


def timing(mover: str, gbps: float, ctas: int | None = None) -> Timing:
    return Timing(Candidate(mover, ctas, 16 if ctas else None), gbps, gbps)


def test_winner_is_the_fastest_unless_a_cheaper_one_is_within_tolerance() -> None:
    fast = timing("kernel", 50.0, 32)
    assert pick_winner([fast, timing("kernel", 40.0, 8), timing("dma", 30.0)]) is fast
    cheap = timing("kernel", 49.0, 8)
    assert pick_winner([fast, cheap, timing("dma", 30.0)]) is cheap
    dma = timing("dma", 48.8)
    assert pick_winner([fast, cheap, dma]) is dma
    assert (
        pick_winner([timing("cpu", 50.0), timing("kernel", 49.5, 64)]).candidate.mover == "kernel"
    )


def test_harmonic_mean_weighs_the_slow_direction() -> None:
    t = Timing(Candidate("dma"), store_gbps=60.0, load_gbps=20.0)
    assert t.gbps == pytest.approx(30.0)


def test_table_aligns_numbers_right_and_text_left() -> None:
    text = format_table([{"mover": "dma", "GB/s": 50.0}, {"mover": "kernel", "GB/s": 7.5}])
    assert text.splitlines() == ["mover    GB/s", "------  -----", "dma     50.00", "kernel   7.50"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_tune_command_without_a_gpu_says_so(capsys, tmp_path: Path) -> None:
    rc = main(["tune", "--model", str(QWEN), "--cache", str(tmp_path / "t.json")])
    assert rc == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()


def test_benchmark_names_pick_the_staged_store_path_and_unknown_names_fail() -> None:
    lanes = Candidate.named("staged-lanes")
    assert (lanes.mover, lanes.lane_stores, lanes.label) == ("staged", True, "staged-lanes")
    assert Candidate.named("staged") == Candidate("staged") and not Candidate("staged").lane_stores
    with pytest.raises(ValueError, match="no mover named 'stagedlanes'"):
        Candidate("stagedlanes").build(None, {}, None)  # type: ignore[arg-type]


def test_direct_stores_cost_the_staged_mover_the_kernels_ctas() -> None:
    """Among near-equals the default staged mover ties with a kernel of its store CTAs, and
    the faster wins; through the lanes it is cheaper than a kernel of the default CTAs."""
    assert Candidate("staged").sm_cost == Candidate("kernel", DEFAULT_CTAS).sm_cost
    assert Candidate("staged", ctas=8).sm_cost == Candidate("kernel", 8).sm_cost
    assert Candidate.named("staged-lanes").sm_cost < Candidate("kernel", DEFAULT_CTAS).sm_cost
    staged = Timing(Candidate("staged"), 49.0, 49.0)
    kernel = Timing(Candidate("kernel", DEFAULT_CTAS, 16), 50.0, 50.0)
    assert pick_winner([staged, kernel]) is kernel
    lanes = Timing(Candidate.named("staged-lanes"), 49.0, 49.0)
    assert pick_winner([lanes, kernel]) is lanes
