"""Offline ``LLM(...)`` users: the connector refuses a bad setting first thing, creating nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from miniflex.errors import ConfigError
from tests.connector.harness import make_harness


def test_a_second_engine_on_a_live_ssd_directory_is_refused_before_it_allocates(
    tmp_path: Path, direct_dir: Path
) -> None:
    ssd = {"ssd_dirs": str(direct_dir), "ssd_bytes": "1MiB"}
    first = make_harness(tmp_path / "model", extra=ssd)
    pool = tmp_path / "pool"
    before = sorted(os.listdir(direct_dir / "rank0"))
    try:
        with pytest.raises(ConfigError, match=r"ssd_dirs=.*a live MiniFlex store \(pid \d+"):
            make_harness(tmp_path / "model", extra={**ssd, "cpu_pool_file": str(pool)})
    finally:
        first.worker.shutdown()
    assert not os.path.exists(f"{pool}.0")  # the CPU pool's file was never created
    assert sorted(os.listdir(direct_dir / "rank0")) == before


def test_a_cpu_tier_below_one_chunk_names_the_chunk_size(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cpu_bytes='2.00 KiB': holds no chunk of this model"):
        make_harness(tmp_path / "model", cpu_bytes="2KiB")
