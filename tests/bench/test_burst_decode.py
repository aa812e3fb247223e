"""The burst and decode workloads' requests and verdicts, the engine mode, and provenance."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest

from miniflex.tools.bench.args import add_arguments
from miniflex.tools.bench.burst import BurstWorkload
from miniflex.tools.bench.decode import DecodeCase, DecodeWorkload
from miniflex.tools.bench.model import PromptMaker
from miniflex.tools.bench.offline_driver import EngineSettings
from miniflex.tools.bench.provenance import git_commit, provenance

PROMPTS = PromptMaker(vocab_size=1000, seed=0)


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(["burst", *argv])


def test_every_prefix_is_sent_equally_often_with_fresh_suffixes_each_round() -> None:
    w = BurstWorkload(PROMPTS, prefixes=3, prefix_tokens=8, suffix_tokens=4, requests=6)
    r0, r1 = w.arrivals(0), w.arrivals(1)
    assert Counter(a.label for a in r0) == {"prefix0": 2, "prefix1": 2, "prefix2": 2}
    assert all(a.at_s == 0.0 and len(a.tokens) == 12 for a in r0)  # all at once
    prefix0 = [a.tokens[:8] for a in r0 + r1 if a.label == "prefix0"]
    assert all(p == prefix0[0] for p in prefix0)  # shared
    suffixes = [tuple(a.tokens[8:]) for a in r0 + r1]
    assert len(set(suffixes)) == len(suffixes)  # never twice, across rounds too
    paced = BurstWorkload(PROMPTS, requests=6, prefixes=3, rate=100.0).arrivals(0)
    assert paced[0].at_s == 0.0 and paced[-1].at_s > 0.0


def test_burst_summary_holds_the_last_round_against_native_and_cpu_only() -> None:
    def row(config: str, round_: int, out: float, cached: int) -> dict:
        return {"config": config, "round": round_, "out_tok_s": out, "cached_tokens": cached}

    rows = [
        row("native", 0, 50, 0),
        row("native", 1, 100, 1000),
        row("miniflex-cpu", 1, 120, 1200),
        row("miniflex-ssd", 1, 118, 1200),
    ]
    s = BurstWorkload(PROMPTS).summary(rows, {})
    assert s["vs_native"]["miniflex-cpu"] == {"throughput_x": 1.2, "cached_at_least": True}
    assert s["ssd_vs_cpu_x"] == 0.983
    assert any("1.20x native" in line and "met" in line for line in s["lines"])
    assert "ssd_vs_cpu_all_rounds_x" not in s  # no makespans: nothing to add up


def test_burst_summary_adds_up_every_round_of_cpu_ssd_against_cpu_only() -> None:
    """Over all rounds: output tokens over makespans, so a long round weighs more."""

    def row(config: str, round_: int, makespan: float) -> dict:
        out = 600 / makespan  # 600 output tokens a round
        return {
            "config": config,
            "round": round_,
            "out_tok_s": out,
            "makespan_s": makespan,
            "cached_tokens": 0,
        }

    rows = [row("miniflex-cpu", 0, 6.0), row("miniflex-cpu", 1, 6.0)]
    rows += [row("miniflex-ssd", 0, 4.0), row("miniflex-ssd", 1, 12.0)]
    s = BurstWorkload(PROMPTS).summary(rows, {})
    assert s["ssd_vs_cpu_by_round_x"] == [1.5, 0.5]
    assert s["ssd_vs_cpu_all_rounds_x"] == 0.75  # 1200 tokens in 16 s against 12 s
    assert any("over all 2 rounds: 0.75x" in line for line in s["lines"])


def test_decode_cases_parse_and_compare_with_apc() -> None:
    assert DecodeCase.parse("32x512x256") == DecodeCase(32, 512, 256)
    with pytest.raises(ValueError, match="PROMPTSxTOKENSxOUT"):
        DecodeCase.parse("32x512")
    assert parse("--decode-cases", "4x128x16,1x512x8").decode_cases == (
        DecodeCase(4, 128, 16),
        DecodeCase(1, 512, 8),
    )
    rows = [
        {"config": "apc", "case": "a", "out_tok_s": 100.0},
        {"config": "miniflex-cpu", "case": "a", "out_tok_s": 98.0},
    ]
    s = DecodeWorkload(PROMPTS).summary(rows, {})
    assert s["vs_apc"] == {"miniflex-cpu": {"a": 0.98}}
    assert "NOT met" in s["lines"][0]


def test_benchmarks_run_vllm_with_its_graphs_unless_told_eager() -> None:
    settings = EngineSettings(
        model="m", block_size=16, gpu_blocks=8, max_model_len=64, kv_bytes_per_token=1
    )
    assert settings.llm_args(cuda=True)["enforce_eager"] is False
    assert parse().eager is False and parse("--eager").eager is True


def test_results_record_the_commit_versions_and_device() -> None:
    p = provenance(cuda=False, commit="abc123")
    assert p["commit"] == "abc123" and p["device"] and p["python"]
    assert "numpy" in p["versions"] and p["host_cpus"] >= 1
    head = git_commit()
    assert head == "unknown" or len(head.removesuffix("+dirty")) == 40
