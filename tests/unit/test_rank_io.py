"""What a worker rank opens at register time, and that a failure part-way closes it again."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from miniflex.config import MiniFlexConfig
from miniflex.errors import ConfigError
from miniflex.ranks import RankSetup
from miniflex.worker.rank_io import open_rank_io

SLOTS = 4


def caches() -> dict[str, torch.Tensor]:
    return {f"layer.{i}": torch.zeros(8, 1, 16, 128, dtype=torch.float16) for i in range(2)}


def test_a_rank_opens_its_pool_movers_and_no_ssd_without_ssd_dirs(tmp_path: Path) -> None:
    config = MiniFlexConfig(mover="cpu", cpu_pool_file=str(tmp_path / "pool"))
    io = open_rank_io(config, caches(), SLOTS, 1, RankSetup())
    try:
        assert io.ssd is None
        assert io.pool.slot_bytes == io.layout.geometry.slot_bytes
        assert (tmp_path / "pool.0").exists()  # rank 0's pool file
        assert io.mover is not io.store_mover
    finally:
        io.pool.close()
    assert not (tmp_path / "pool.0").exists()


def test_a_failing_ssd_store_closes_the_pool_it_was_opened_beside(tmp_path: Path) -> None:
    gone = tmp_path / "ssd"
    gone.mkdir()
    pool_file = str(tmp_path / "pool")
    config = MiniFlexConfig(
        mover="cpu", ssd_dirs=(str(gone),), ssd_bytes=1 << 20, cpu_pool_file=pool_file
    )
    gone.rmdir()  # removed after the config was checked: the SSD store cannot open
    with pytest.raises(ConfigError, match="cannot be created"):
        open_rank_io(config, caches(), SLOTS, 1, RankSetup(shard_digest=b"\x01" * 16))
    assert not (tmp_path / "pool.0").exists()  # closed, so its file is gone and unlocked
    again = MiniFlexConfig(mover="cpu", cpu_pool_file=pool_file)
    open_rank_io(again, caches(), SLOTS, 1, RankSetup()).pool.close()
