"""The status file and ``miniflex inspect``: what an operator sees of a live engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from miniflex.cli import main
from miniflex.connector import MiniFlexConnector
from miniflex.errors import ConfigError
from miniflex.inspect import inspect_status, load_status
from tests.connector.harness import BLOCK, make_harness

CHUNK = 2 * BLOCK


def test_status_file_shows_tiers_cost_model_and_totals(
    tmp_path: Path, direct_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = tmp_path / "status.json"
    h = make_harness(
        tmp_path / "model",
        extra={"status_file": str(status), "ssd_dirs": str(direct_dir), "ssd_bytes": "1MiB"},
    )
    prompt = [(i * 104729) % 997 + 3 for i in range(5 * CHUNK + 10)]
    h.cached_in_miniflex_only("a", prompt)
    h.add("b", prompt)
    h.run()
    h.worker.shutdown()
    h.manager_side.shutdown()  # writes the final state

    data = load_status(status)
    tiers = {t["tier"]: t for t in data["tiers"]}
    assert tiers["cpu"]["resident"] == 5 and tiers["ssd"]["slots"] == 256
    assert data["totals"]["hit_tokens_cpu"] == 5 * CHUNK
    assert data["totals"]["stored_tokens"] == 5 * CHUNK
    assert data["cost_model"]["observed_steps"] >= 1

    assert main(["inspect", str(status)]) == 0
    out = capsys.readouterr().out
    assert "cost model: hit_policy=cost" in out and "hit_tokens_cpu" in out
    assert inspect_status(status).splitlines()[0].startswith("MiniFlex status of pid")


def test_inspect_refuses_what_is_not_a_status_file(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ConfigError, match="status file"):
        load_status(other)
    assert main(["inspect", str(tmp_path / "missing.json")]) == 2


def on_registry(kind: type, registry: object) -> type:
    """vLLM's metric class ``kind``, registering on ``registry`` instead of the global one."""

    def init(self: object, *args: object, **kwargs: object) -> None:
        kind.__init__(self, *args, registry=registry, **kwargs)  # type: ignore[misc]

    return type(kind.__name__, (kind,), {"__init__": init})


def test_prometheus_counters_follow_the_stats_vllm_reports(tmp_path: Path) -> None:
    import prometheus_client as prom

    registry = prom.CollectorRegistry()
    h = make_harness(tmp_path / "model")
    prompt = [(i * 7919) % 997 + 3 for i in range(5 * CHUNK + 10)]
    h.cached_in_miniflex_only("a", prompt)
    h.add("b", prompt)
    h.run()
    types = {k: on_registry(k, registry) for k in (prom.Gauge, prom.Counter, prom.Histogram)}
    metrics = MiniFlexConnector.build_prom_metrics(
        h.sched.vllm_config, types, ["model_name", "engine"], {0: ["m", "0"]}
    )
    for data in h.kv_stats:  # what vLLM's stats loggers receive, interval by interval
        metrics.observe(data, engine_idx=0)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"model_name": "m", "engine": "0", **labels})

    assert value("vllm:miniflex_hit_tokens_total", tier="cpu") == 5 * CHUNK
    assert value("vllm:miniflex_hit_tokens_total", tier="ssd") == 0
    assert value("vllm:miniflex_stored_tokens_total") == 5 * CHUNK
    assert (value("vllm:miniflex_transfer_bytes_total", kind="load") or 0) > 0
    for where in ("scheduler_hooks", "worker_hooks", "threads"):
        assert (value("vllm:miniflex_time_taken_seconds_total", where=where) or 0) > 0, where
