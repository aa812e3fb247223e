"""The start-up read probe: a measured read speed, nothing left behind, never a crash."""

from __future__ import annotations

import os
from pathlib import Path

from miniflex.cost import CostModel
from miniflex.ssd import IOBackend
from miniflex.ssd.read_probe import SCRATCH, probe_read_bandwidth
from miniflex.tiers.admission import SSDAdmission
from miniflex.types import Tier

CHUNK = 1 << 20


def test_reads_chunks_back_and_removes_its_scratch_file(
    direct_dir: Path, backend: IOBackend
) -> None:
    d = direct_dir
    before = set(os.listdir(d))
    bps = probe_read_bandwidth(backend, str(d), CHUNK, probe_bytes=8 * CHUNK)
    assert bps is not None and bps > 0
    assert set(os.listdir(d)) == before and SCRATCH not in before


def test_a_directory_it_cannot_write_gives_no_measurement_not_an_error(
    tmp_path: Path, backend: IOBackend
) -> None:
    assert probe_read_bandwidth(backend, str(tmp_path / "missing"), CHUNK, 8 * CHUNK) is None


def test_the_cost_model_trusts_a_measured_disk_not_its_default_guess() -> None:
    cost = CostModel(chunk_bytes=8 * CHUNK, chunk_tokens=64)
    assert cost.ssd_chunk_seconds() is None  # 1 GB/s is a guess: admission does not use it
    admission = SSDAdmission(cost.ssd_chunk_seconds, lambda: 0.001)
    assert admission.pays_off  # unknown: admitted
    cost.start_ssd_from_probe(1e9)
    assert cost.ssd_chunk_seconds() is not None and not admission.pays_off  # 8 ms > 1 ms
    fixed = CostModel(8 * CHUNK, 64, {Tier.SSD: 20e9}, frozenset({Tier.SSD}))
    fixed.start_ssd_from_probe(1e9)  # ssd_read_gbps wins over the probe
    assert fixed.bandwidth[Tier.SSD] == 20e9 and fixed.ssd_chunk_seconds() is not None


def test_the_first_read_seen_replaces_the_guess() -> None:
    cost = CostModel(chunk_bytes=CHUNK, chunk_tokens=64)
    cost.observe_load(Tier.SSD, 3 * 10**9, 1.0)
    assert cost.bandwidth[Tier.SSD] == 3e9 and cost.ssd_chunk_seconds() is not None
