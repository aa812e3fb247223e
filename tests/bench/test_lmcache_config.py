"""The ``lmcache`` configuration: its KV transfer config, environment and availability check
(CPU only; LMCache itself is not needed)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess

import pytest

from miniflex.tools.bench import lmcache_probe
from miniflex.tools.bench.configs import CONFIGS, Connector, TierSizes, lmcache_unavailable

GiB = 1 << 30


def tiers(cpu_bytes: int) -> TierSizes:
    return TierSizes(
        cpu_bytes=cpu_bytes, ssd_cpu_bytes=1 << 28, ssd_bytes=1 << 31, ssd_dir=None, chunk_tokens=64
    )


def test_lmcache_gets_the_cpu_tier_of_the_others_as_its_local_cpu_backend() -> None:
    kv = CONFIGS["lmcache"].kv_transfer(tiers(GiB))
    assert kv == {
        "kv_connector": "LMCacheConnectorV1",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "lmcache.chunk_size": 256,
            "lmcache.local_cpu": True,
            "lmcache.max_local_cpu_size": 1.0,
            "lmcache.local_disk": None,
            "lmcache.max_local_disk_size": 0,
            "lmcache.remote_url": None,
        },
    }
    # LMCache allocates int(max_local_cpu_size * 1024**3) bytes: the same bytes as the others
    for cpu_bytes in (64 << 20, 5 * GiB + (192 << 20), 37 * GiB + (64 << 20)):
        extra = CONFIGS["lmcache"].kv_transfer(tiers(cpu_bytes))["kv_connector_extra_config"]
        assert int(extra["lmcache.max_local_cpu_size"] * 1024**3) == cpu_bytes
    assert (
        CONFIGS["native"].kv_transfer(tiers(GiB))["kv_connector_extra_config"]["cpu_bytes_to_use"]
        == GiB
    )


def test_lmcache_hits_are_counted_like_the_native_connectors() -> None:
    assert CONFIGS["lmcache"].connector is Connector.LMCACHE
    assert Connector.LMCACHE.hits_from_vllm_counter and Connector.NATIVE.hits_from_vllm_counter
    assert not Connector.MINIFLEX.hits_from_vllm_counter
    assert not Connector.NONE.hits_from_vllm_counter


def test_the_environment_is_set_while_the_engine_starts_then_restored(monkeypatch) -> None:
    monkeypatch.setenv("LMCACHE_LOG_LEVEL", "DEBUG")
    monkeypatch.delenv("LMCACHE_TRACK_USAGE", raising=False)
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "warning")
    with CONFIGS["lmcache"].environment():
        assert os.environ["LMCACHE_TRACK_USAGE"] == "false"
        assert os.environ["LMCACHE_LOG_LEVEL"] == "WARNING"
    assert os.environ["LMCACHE_LOG_LEVEL"] == "DEBUG"
    assert "LMCACHE_TRACK_USAGE" not in os.environ
    before = dict(os.environ)
    with CONFIGS["miniflex-cpu"].environment():
        assert dict(os.environ) == before


def test_without_cuda_lmcache_is_skipped_before_any_import(monkeypatch) -> None:
    def no_probe(*args, **kwargs):
        raise AssertionError("probed LMCache without CUDA")

    monkeypatch.setattr(lmcache_probe.subprocess, "run", no_probe)
    assert "CUDA only" in CONFIGS["lmcache"].unavailable(on_cuda=False)


def probe_returning(monkeypatch, stdout: str = "", stderr: str = "", rc: int = 0) -> list[dict]:
    seen: list[dict] = []

    def run(cmd, **kwargs):
        seen.append({"cmd": cmd, "env": dict(os.environ)})
        return subprocess.CompletedProcess(cmd, rc, stdout, stderr)

    monkeypatch.setattr(lmcache_probe.subprocess, "run", run)
    return seen


def test_left_out_names_the_exact_import_error(monkeypatch) -> None:
    stderr = "Traceback (most recent call last):\n  ...\n"
    stderr += "ModuleNotFoundError: No module named 'aiofile'\n"
    seen = probe_returning(monkeypatch, stderr=stderr, rc=1)
    why = lmcache_unavailable.__wrapped__()
    assert why == (
        "left out: LMCache is not importable here: ModuleNotFoundError: No module named 'aiofile'"
    )
    assert seen[0]["env"]["LMCACHE_TRACK_USAGE"] == "false"  # the probe reports nothing either


def test_left_out_when_lmcache_would_run_on_its_torch_fallback(monkeypatch) -> None:
    undefined = "lmcache/cuda_ops.so: undefined symbol: _ZN3c1019NotImplementedErrorC1E"
    found = {"version": "0.5.6", "device": "cuda", "native": False, "error": undefined}
    probe_returning(monkeypatch, stdout=json.dumps(found) + "\n")
    why = lmcache_unavailable.__wrapped__()
    assert why.startswith("left out: LMCache 0.5.6's CUDA kernels do not load")
    assert undefined in why and "wrong slots" in why


def test_runs_with_native_kernels_on_cuda(monkeypatch) -> None:
    ok = '{"version": "0.5.3", "device": "cuda", "native": true, "error": null}'
    probe_returning(monkeypatch, stdout="LMCache banner\n" + ok + "\n")
    assert lmcache_unavailable.__wrapped__() is None
    probe_returning(monkeypatch, stdout=ok.replace('"cuda"', '"cpu"'))
    assert "does not see a CUDA device" in lmcache_unavailable.__wrapped__()
    unknown = {"version": "0.9", "device": "cuda", "native": None, "error": "ImportError: x"}
    probe_returning(monkeypatch, stdout=json.dumps(unknown))
    assert "cannot tell whether LMCache 0.9's CUDA kernels" in lmcache_unavailable.__wrapped__()


@pytest.mark.skipif(importlib.util.find_spec("lmcache") is not None, reason="LMCache installed")
def test_the_real_probe_reports_a_missing_lmcache() -> None:
    assert lmcache_unavailable.__wrapped__() == (
        "left out: LMCache is not importable here: ModuleNotFoundError: No module named 'lmcache'"
    )
