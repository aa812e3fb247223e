"""The pool a replicated (MLA) cache's ranks share: one mapping, a ledger for SSD reads."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from miniflex.errors import ConfigError
from miniflex.shared_pool import SharedPool, shared_pool_path
from miniflex.types import SlotId

SLOT = 4096


def test_every_rank_maps_the_same_bytes_and_the_file_goes_once_all_attached(
    tmp_path: Path,
) -> None:
    path = tmp_path / "pool"
    rank0 = SharedPool(4, SLOT, path, ranks=2)
    assert path.exists()  # rank 1 has not attached yet
    rank1 = SharedPool(4, SLOT, path, ranks=2)
    assert not path.exists()
    rank0.slot(SlotId(3))[:5] = 9
    assert (rank1.slot(SlotId(3))[:5] == 9).all()
    assert rank0.address % 4096 == 0
    rank0.close()
    rank1.close()


def test_a_configured_pool_file_stays_until_close(tmp_path: Path) -> None:
    path = shared_pool_path("engine-1", str(tmp_path / "pool"))
    assert path.name == "pool.engine-1"
    pools = [SharedPool(2, SLOT, path, ranks=2, keep_file=True) for _ in range(2)]
    assert path.exists()
    for p in pools:
        p.close()
    assert not path.exists()


def test_another_geometry_on_the_same_file_is_refused(tmp_path: Path) -> None:
    first = SharedPool(4, SLOT, tmp_path / "pool", ranks=2)
    with pytest.raises(ConfigError, match="no other engine"):
        SharedPool(8, SLOT, tmp_path / "pool", ranks=2)
    first.close()


def test_a_rank_waits_for_the_read_that_job_published_and_not_an_older_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "pool"
    writer, reader = (SharedPool(2, SLOT, path, ranks=2) for _ in range(2))
    writer.publish(SlotId(1), job_id=4, ok=True)  # an earlier job's read of that slot
    assert not reader.wait_published(SlotId(1), job_id=7, timeout_s=0.05)

    def read_later() -> None:
        time.sleep(0.05)
        writer.slot(SlotId(1))[:] = 5
        writer.publish(SlotId(1), job_id=7, ok=True)

    thread = threading.Thread(target=read_later)
    thread.start()
    assert reader.wait_published(SlotId(1), job_id=7, timeout_s=5)
    assert (reader.slot(SlotId(1)) == 5).all()
    thread.join()
    writer.publish(SlotId(0), job_id=8, ok=False)
    assert not reader.wait_published(SlotId(0), job_id=8, timeout_s=5)
    writer.close()
    reader.close()


def test_a_file_system_too_small_for_the_pool_is_refused_at_start_up(tmp_path: Path) -> None:
    import os

    st = os.statvfs(tmp_path)
    too_many = st.f_bavail * st.f_frsize // SLOT + 1
    with pytest.raises(ConfigError, match="bytes free there"):
        SharedPool(too_many, SLOT, tmp_path / "pool", ranks=2)
    assert not (tmp_path / "pool").exists()
