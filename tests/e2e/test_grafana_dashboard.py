"""The Grafana dashboard in ``docs/grafana/miniflex.json``, read against a live server.

A real Prometheus scrapes a running ``miniflex serve`` (CPU, SSD and remote tiers) while
prompts are served from each tier; every query of every panel, with Grafana's variables
filled in as Grafana fills them, must then return the series its panel draws.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from miniflex.connector.prom import _GAUGES, _METRICS
from miniflex.remote.local_server import LocalServer
from tests.e2e.conftest import NEEDS_REDIS
from tests.e2e.engine import CHUNK_TOKENS, KV_BYTES_PER_TOKEN, prompt
from tests.e2e.prometheus_proc import Prometheus, prometheus_binary, running_prometheus
from tests.e2e.serve_proc import serving
from tests.e2e.test_serve_http import complete

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "miniflex.json"
CHUNK_BYTES = CHUNK_TOKENS * KV_BYTES_PER_TOKEN
PROMPT_TOKENS = 1000  # 15 chunks
TIERS = ("cpu", "ssd", "remote")


def panels() -> list[dict[str, Any]]:
    return json.loads(DASHBOARD.read_text())["panels"]


def as_grafana_sends(expr: str) -> str:
    """A panel's query as Grafana sends it: every model, a rate window of 2 minutes."""
    return expr.replace("$__rate_interval", "2m").replace("$model", ".*")


def test_dashboard_reads_only_metrics_that_exist() -> None:
    """Every MiniFlex metric a panel reads is one the connector exports; panels tile the grid."""
    exported = {f"{n}_total" for n in _METRICS} | set(_GAUGES)
    cells: set[tuple[int, int]] = set()
    for p in panels():
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
        for t in p["targets"]:
            for name in re.findall(r"vllm:miniflex_\w+", t["expr"]):
                assert name in exported, f"{p['title']}: {name} is not exported"
        g = p["gridPos"]
        mine = {(g["x"] + i, g["y"] + j) for i in range(g["w"]) for j in range(g["h"])}
        assert g["x"] + g["w"] <= 24 and not mine & cells, f"{p['title']} overlaps"
        cells |= mine


@pytest.fixture
def scraped(
    tiny_model: Path, ssd_dir: Path, redis_server: LocalServer, tmp_path: Path
) -> Iterator[tuple[str, Prometheus]]:
    """A server whose CPU and SSD tiers hold 16 chunks each (a prompt has 15), writing every
    chunk through to a remote store, with vLLM's own prefix cache off (so that every repeat is
    MiniFlex's); Prometheus scrapes it every second."""
    pytest.importorskip("redis")
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (scripts/test.sh installs it as root)")
    env = {
        "MINIFLEX_CPU_BYTES": str(16 * CHUNK_BYTES),
        "MINIFLEX_SSD_DIRS": str(ssd_dir),
        "MINIFLEX_SSD_BYTES": str(16 * CHUNK_BYTES),
        "MINIFLEX_REMOTE_URL": redis_server.url,
        "MINIFLEX_REMOTE_WRITE": "through",
        "MINIFLEX_PREFILL_TOKENS_PER_S": "100",  # every tier is faster than recompute
    }
    args = ("--no-enable-prefix-caching",)
    with (
        serving(tiny_model, tmp_path / "server.log", env, args) as url,
        running_prometheus(tmp_path / "prom", "miniflex", [url.split("//")[1]]) as prom,
    ):
        yield url, prom


def served_by(prom: Prometheus, metric: str, label: str) -> dict[str, float]:
    return {
        r["metric"].get(label, ""): float(r["value"][1])
        for r in prom.query(f"sum by ({label}) ({metric})")
    }


@pytest.mark.e2e
@pytest.mark.skipif(*NEEDS_REDIS[0].args, **NEEDS_REDIS[0].kwargs)
def test_every_panel_draws_against_a_live_server(scraped: tuple[str, Prometheus]) -> None:
    url, prom = scraped
    deadline = time.monotonic() + 30
    while prom.scrapes("miniflex") < 2:  # rates need a sample from before the traffic
        assert time.monotonic() < deadline, "Prometheus has not scraped the server"
        time.sleep(0.5)
    prompts = [prompt(400 + i, PROMPT_TOKENS) for i in range(5)]
    for tokens in prompts:  # the last ends up in CPU, the last but one in SSD, the first
        complete(url, tokens)  # only in the remote store
    for again in (prompts[-1], prompts[-2], prompts[0]):
        complete(url, again)
    deadline = time.monotonic() + 60
    while True:  # until a scrape after the engine fell idle has every tier's hits
        hits = served_by(prom, "vllm:miniflex_hit_tokens_total", "tier")
        idle = served_by(prom, "vllm:miniflex_jobs_in_flight", "job") == {"miniflex": 0.0}
        if (idle and all(hits.get(t) for t in TIERS)) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert all(hits.get(t) for t in TIERS) and idle, hits
    drawn = {
        p["title"]: [prom.query(as_grafana_sends(t["expr"])) for t in p["targets"]]
        for p in panels()
    }
    for title, results in drawn.items():
        for i, result in enumerate(results):
            assert result, f"panel {title!r}, query {i}: no series"
    hit_rate = first_query(drawn["Hit rate by tier"], "tier")
    tier_bytes = first_query(drawn["Bytes/s by tier"], "tier", "op")
    for tier in TIERS:
        assert hit_rate[(tier,)] > 0, hit_rate
        assert tier_bytes[(tier, "read")] > 0 and tier_bytes[(tier, "write")] > 0, tier_bytes
    assert first_query(drawn["Load vs recompute"], "choice")[("load",)] > 0
    puts = first_query(drawn["Remote puts by outcome"], "outcome")
    assert puts[("acked",)] > 0 and puts[("failed",)] == 0, puts  # every label from the start
    assert first_query(drawn["Write-back backlog"]) == {(): 0}  # idle: every write reported


def first_query(results: list[list[dict[str, Any]]], *labels: str) -> dict[tuple, float]:
    """A panel's first query's values by the ``labels`` of each series."""
    return {tuple(r["metric"][k] for k in labels): float(r["value"][1]) for r in results[0]}
