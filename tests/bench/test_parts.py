"""The benchmark's building blocks: configurations, sizes, prompts, samples, tables, plots."""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest

from miniflex.errors import ConfigError
from miniflex.tools.bench.base import WARMUP_TOKENS
from miniflex.tools.bench.configs import CONFIGS, TierSizes, base_name, parse_configs
from miniflex.tools.bench.model import ModelShape, PromptMaker
from miniflex.tools.bench.overflow import OverflowWorkload
from miniflex.tools.bench.plot import save_plot
from miniflex.tools.bench.report import format_table
from miniflex.tools.bench.samples import (
    Sample,
    load_seconds,
    percentile,
    resident_tokens,
    tier_tokens,
)
from miniflex.tools.bench.sizing import SAME_AS_CPU, auto_tiers, max_model_len
from miniflex.tools.bench.ttft import TTFTWorkload

QWEN = Path(__file__).parents[2] / "bench" / "models" / "qwen3-8b-shape"
TIERS = TierSizes(
    cpu_bytes=1 << 30, ssd_cpu_bytes=1 << 28, ssd_bytes=1 << 31, ssd_dir="/data", chunk_tokens=64
)


def test_unknown_configuration_lists_the_valid_ones() -> None:
    with pytest.raises(
        ConfigError,
        match="apc, native, miniflex-cpu, miniflex-ssd, native-fs, lmcache, miniflex-sync, "
        "miniflex-layerwise, miniflex-async",
    ):
        parse_configs("apc,vllm-magic")
    assert [c.name for c in parse_configs("miniflex-cpu, apc")] == ["miniflex-cpu", "apc"]


def test_a_miniflex_configuration_takes_settings_after_a_plus() -> None:
    apc, variant = parse_configs("apc,miniflex-cpu+store=false+staging_lane_bytes=8MiB")
    assert apc is CONFIGS["apc"]
    assert variant.name == "miniflex-cpu+store=false+staging_lane_bytes=8MiB"
    cfg = variant.kv_transfer(TIERS)
    assert cfg is not None and cfg["kv_connector_extra_config"] == {
        "cpu_bytes": 1 << 30,
        "store": "false",
        "staging_lane_bytes": "8MiB",
    }
    assert CONFIGS["miniflex-cpu"].kv_transfer(TIERS)["kv_connector_extra_config"] == {
        "cpu_bytes": 1 << 30
    }
    with pytest.raises(ConfigError, match="unknown key"):
        parse_configs("miniflex-cpu+stor=false")
    with pytest.raises(ConfigError, match="expected true or false"):
        parse_configs("miniflex-cpu+store=maybe")
    with pytest.raises(ConfigError, match="MiniFlex only"):
        parse_configs("apc+store=false")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_configs("miniflex-cpu+store")


def test_a_repeat_suffix_starts_another_engine_of_the_same_configuration() -> None:
    cpu, ssd, cpu2, variant2 = parse_configs(
        "miniflex-cpu,miniflex-ssd,miniflex-cpu#2,miniflex-ssd+store=false#3"
    )
    assert [c.name for c in (cpu, ssd, cpu2, variant2)] == [
        "miniflex-cpu",
        "miniflex-ssd",
        "miniflex-cpu#2",
        "miniflex-ssd+store=false#3",
    ]
    assert cpu2.kv_transfer(TIERS) == cpu.kv_transfer(TIERS)
    assert variant2.kv_transfer(TIERS)["kv_connector_extra_config"] == {
        **ssd.kv_transfer(TIERS)["kv_connector_extra_config"],
        "store": "false",
    }
    assert [base_name(c.name) for c in (cpu2, variant2)] == ["miniflex-cpu", "miniflex-ssd"]
    for bad in ("miniflex-cpu#", "miniflex-cpu#1", "miniflex-cpu#two", "apc,apc#2,apc#2"):
        with pytest.raises(ConfigError):
            parse_configs(bad)
    with pytest.raises(ConfigError, match="expected one of"):
        parse_configs("vllm-magic#2")


def test_load_mode_configurations_differ_from_miniflex_cpu_only_in_load_mode() -> None:
    base = CONFIGS["miniflex-cpu"].kv_transfer(TIERS)
    assert base is not None
    for mode in ("sync", "layerwise", "async"):
        cfg = CONFIGS[f"miniflex-{mode}"].kv_transfer(TIERS)
        assert cfg is not None
        extra = dict(cfg["kv_connector_extra_config"])
        assert extra.pop("load_mode") == mode
        assert {**cfg, "kv_connector_extra_config": extra} == base


def test_each_configuration_builds_its_kv_transfer_config() -> None:
    assert CONFIGS["apc"].kv_transfer(TIERS) is None
    native = CONFIGS["native"].kv_transfer(TIERS)
    assert native == {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 30, "block_size": 64},
    }
    cpu = CONFIGS["miniflex-cpu"].kv_transfer(TIERS)
    assert cpu["kv_connector"] == "MiniFlexConnector"
    assert cpu["kv_connector_extra_config"] == {"cpu_bytes": 1 << 30}
    ssd = CONFIGS["miniflex-ssd"].kv_transfer(TIERS)["kv_connector_extra_config"]
    assert ssd == {"cpu_bytes": 1 << 28, "ssd_dirs": "/data", "ssd_bytes": 1 << 31}


def test_native_and_lmcache_are_skipped_on_the_cpu_backend() -> None:
    assert "CPU backend" in CONFIGS["native"].unavailable(on_cuda=False)
    assert CONFIGS["native"].unavailable(on_cuda=True) is None
    assert "CUDA only" in CONFIGS["lmcache"].unavailable(on_cuda=False)
    assert CONFIGS["miniflex-ssd"].unavailable(on_cuda=False) is None


def test_qwen3_8b_shape_has_144_kib_of_kv_per_token() -> None:
    shape = ModelShape.from_dir(QWEN)
    assert shape.kv_bytes_per_token == 36 * 8 * 128 * 2 * 2
    assert ModelShape(vocab_size=100).kv_bytes(10) is None
    with pytest.raises(ConfigError, match=r"config\.json"):
        ModelShape.from_dir(QWEN.parent / "missing")


def test_prompts_are_deterministic_distinct_and_inside_the_vocabulary() -> None:
    make = PromptMaker(2048, seed=3)
    assert make(50, "a", 1) == PromptMaker(2048, seed=3)(50, "a", 1)
    assert make(50, "a", 1) != make(50, "a", 2) != make(50, "b", 1)
    assert all(make.lo <= t < make.hi <= 2048 for t in make(1000, "x"))


def test_tiers_are_sized_from_the_largest_working_set() -> None:
    p = PromptMaker(1000)
    ws = [TTFTWorkload(p, (1000, 4000)), OverflowWorkload(p, prompt_tokens=1000, ratios=(3.0,))]
    t = auto_tiers(ws, 2000, 1 << 10, 16, None, None, None, "/d", None)
    assert t.chunk_tokens == 64  # auto: 4 blocks of 16
    assert t.cpu_bytes >= 6000 * 1024 * 5 // 4 + 2000 * 1024  # overflow: 6 prompts of 1000
    assert t.ssd_cpu_bytes < 6000 * 1024 <= t.ssd_bytes
    given = auto_tiers(ws, 2000, 1 << 10, 16, 123 << 20, 7 << 20, 9 << 20, "/d", 2)
    assert (given.cpu_bytes, given.ssd_cpu_bytes, given.ssd_bytes) == (123 << 20, 7 << 20, 9 << 20)
    assert given.chunk_tokens == 32
    same = auto_tiers(ws, 2000, 1 << 10, 16, None, SAME_AS_CPU, None, "/d", None)
    assert same.ssd_cpu_bytes == same.cpu_bytes == t.cpu_bytes
    given_same = auto_tiers(ws, 2000, 1 << 10, 16, 123 << 20, SAME_AS_CPU, None, "/d", None)
    assert given_same.ssd_cpu_bytes == 123 << 20


def test_max_model_len_covers_the_longest_prompt() -> None:
    ws = [TTFTWorkload(PromptMaker(1000), (1000, 30000))]
    assert max_model_len(ws, 16, 2100, 40960, None) == 30064
    with pytest.raises(ConfigError, match="at least 30064"):
        max_model_len(ws, 16, 2100, 40960, 8192)
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        max_model_len(ws, 16, 2100, 16384, None)
    with pytest.raises(ConfigError, match="at least 1880 blocks"):
        max_model_len(ws, 16, 1024, 40960, None)


def test_max_model_len_covers_the_warm_up_prompt_of_a_run_of_short_prompts() -> None:
    # Each workload prefills a WARMUP_TOKENS prompt first: sized from 192-token prompts
    # alone, vLLM refused it on every engine, after each had started.
    ws = [OverflowWorkload(PromptMaker(1000), prompt_tokens=192, ratios=(2.0,))]
    n = max_model_len(ws, 32, 24, 40960, None)
    assert n == 320 and n > WARMUP_TOKENS
    with pytest.raises(ConfigError, match=f"at least {WARMUP_TOKENS + 64}"):
        max_model_len(ws, 32, 24, 40960, 256)


def test_per_tier_hits_come_from_either_spelling() -> None:
    assert tier_tokens({"hit_tokens": 96, "hit_tokens_cpu": 64, "ssd_hit_tokens": 32}) == {
        "cpu": 64,
        "ssd": 32,
    }
    assert tier_tokens(None) == {}
    s = Sample("x", 100, 1.0, 1.0, cached_tokens=96, external_tokens=64)
    assert s.vllm_hit_tokens == 32 and s.as_dict()["vllm_hit_tokens"] == 32
    assert Sample("x", 100, 1.0, 1.0).vllm_hit_tokens is None


def test_resident_tokens_are_read_apart_from_hits() -> None:
    params = {"hit_tokens": 0, "hit_tokens_ssd": 0, "resident_tokens_ssd": 8192}
    assert resident_tokens(params) == {"ssd": 8192}
    assert tier_tokens(params) == {"ssd": 0}


def test_load_seconds_are_read_from_the_params_and_nothing_else() -> None:
    params = {"hit_tokens": 64, "load": "async", "load_wall_s": 0.5, "load_remote_s": 0.25}
    assert load_seconds(params) == {"wall": 0.5, "remote": 0.25}
    assert load_seconds({"hit_tokens": 0}) == {} and load_seconds(None) == {}


def overflow_row(config: str, ratio: float, p50: float) -> dict:
    return {"config": config, "ratio": ratio, "miss_pct": 0.0, "ttft_p50_ms": p50}


def test_overflow_summary_holds_the_worst_ttft_past_capacity_against_the_one_within() -> None:
    flat = ((0.5, 20.0), (1.0, 30.0), (2.0, 32.0), (3.0, 30.0))
    rows = [overflow_row("flat", r, p) for r, p in flat]
    rows += [overflow_row("steep", r, p) for r, p in ((0.5, 20.0), (1.0, 30.0), (2.0, 40.0))]
    summary = OverflowWorkload(PromptMaker(1000)).summary(rows, {})
    assert summary["flat_x"] == {"flat": 1.28, "steep": 1.6}  # over the median 25 ms
    assert any("steep" in line and "NOT met" in line for line in summary["lines"])
    assert summary["floor_flat_x"] == {} and not any("floor" in ln for ln in summary["lines"])


def test_overflow_floor_adds_one_prompts_copy_at_the_measured_bandwidth() -> None:
    rows = [overflow_row("flat", r, p) for r, p in ((0.5, 20.0), (1.0, 30.0), (2.0, 32.0))]
    rows += [overflow_row("steep", r, p) for r, p in ((0.5, 20.0), (1.0, 30.0), (2.0, 40.0))]
    # 1000 tokens x 10 kB at 1 GB/s: a 10 ms copy over the in-capacity median of 25 ms
    workload = OverflowWorkload(
        PromptMaker(1000), prompt_tokens=1000, kv_bytes_per_token=10_000, bandwidth_gbps=1.0
    )
    assert workload.copy_ms() == 10.0
    summary = workload.summary(rows, {})
    assert summary["floor_flat_x"] == {"flat": 1.4, "steep": 1.4}
    assert summary["x_floor"] == {"flat": 0.91, "steep": 1.14}
    assert any("steep" in ln and "1.14x its floor" in ln for ln in summary["lines"])


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(list(map(float, range(101))), 99) == 99.0


def test_table_shows_unknown_values_as_dashes() -> None:
    text = format_table([{"config": "apc", "hit": None}, {"config": "mf", "hit": 3}])
    assert text.splitlines()[2].split() == ["apc", "-"]


def test_plot_is_skipped_with_a_message_without_matplotlib(tmp_path, monkeypatch) -> None:
    real_import = builtins.__import__

    def no_mpl(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    note = save_plot(tmp_path / "x.png", lambda plt: None)
    assert note.startswith("plot skipped: matplotlib is not installed")
    assert not (tmp_path / "x.png").exists()
