"""Where vLLM's own metrics say a MiniFlex hit came from: the CPU tier ("host") or SSD ("disk").

vLLM 0.32 added ``get_external_cache_hit_sources``: after each admission it asks
the connector which tier supplies the tokens it promised, and counts them in
``vllm:prompt_tokens_cached_by_source``. Older versions never ask, so these
flows are skipped there, with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import prometheus_client as prom
import pytest
import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

from tests.connector.engine_config import tokens
from tests.connector.harness import BLOCK, Harness, make_harness
from tests.connector.stats_sum import totals as summed_totals

CHUNK = 2 * BLOCK
SLOT = 4096  # the harness's chunk: 2 layers x 2 blocks x 1 KiB pages

pytestmark = pytest.mark.skipif(
    not hasattr(KVConnectorBase_V1, "get_external_cache_hit_sources"),
    reason=f"vLLM {vllm.__version__} counts no hits by source (vLLM 0.32 added that)",
)


def totals(h: Harness) -> dict[str, float]:
    return summed_totals(h.kv_stats)


@pytest.fixture
def vllm_metrics() -> Iterator[None]:
    """vLLM's Prometheus logger registers on the global registry: leave it as found."""
    from vllm.v1.metrics.prometheus import unregister_vllm_metrics

    yield
    unregister_vllm_metrics()


def test_a_cpu_hit_is_counted_as_host_in_vllms_prometheus_metric(
    tmp_path: Path, vllm_metrics: None
) -> None:
    h = make_harness(tmp_path / "model")
    prompt = tokens(1, 5 * CHUNK + 10)
    h.cached_in_miniflex_only("a", prompt)
    h.add("b", prompt)
    h.run()
    assert h.hits_by_source() == {"host": 5 * CHUNK}
    assert totals(h)["hit_tokens_cpu"] == 5 * CHUNK

    # what /metrics shows: vLLM's own logger fed the stats the scheduler produced
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    logger = PrometheusStatLogger(h.sched.vllm_config)
    for stats in h.scheduler_stats:
        logger.record(stats, None)
    model = h.sched.vllm_config.model_config.served_model_name

    def cached(source: str) -> float | None:
        labels = {"model_name": model, "engine": "0", "source": source}
        return prom.REGISTRY.get_sample_value("vllm:prompt_tokens_cached_by_source_total", labels)

    assert cached("host") == 5 * CHUNK
    assert cached("disk") == cached("external_unspecified") == 0


def test_ssd_hits_are_disk_and_a_prefix_split_across_tiers_is_split(
    tmp_path: Path, direct_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    h = make_harness(
        tmp_path / "model",
        cpu_bytes=str(8 * SLOT),
        max_batched=2 * CHUNK,
        extra={"ssd_dirs": str(direct_dir), "ssd_bytes": str(64 * SLOT), "hit_policy": "load"},
    )
    for i in range(3):  # 15 chunks through 8 CPU slots: tokens(0, ...) ends up on SSD only
        h.cached_in_miniflex_only(f"w{i}", tokens(i, 5 * CHUNK + 10))
    assert h.hits_by_source() == {}

    h.add("head", tokens(0, 2 * CHUNK + 5))  # its two chunks: promoted into the CPU tier
    h.run()
    assert h.hits_by_source() == {"disk": 2 * CHUNK}

    assert h.sched.reset_prefix_cache()
    h.add("whole", tokens(0, 5 * CHUNK + 10))  # chunks 0-1 in CPU, 2-4 on SSD
    h.run()
    assert h.hits_by_source() == {"disk": 5 * CHUNK, "host": 2 * CHUNK}
    t = totals(h)  # MiniFlex's own counters agree
    assert t["hit_tokens_ssd"] == 5 * CHUNK and t["hit_tokens_cpu"] == 2 * CHUNK
    h.worker.shutdown()
