"""The SSD tier's pre-start check: one ConfigError per bad setting, and nothing left behind."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from miniflex.errors import ConfigError
from miniflex.ssd import IOBackend, SSDStore
from miniflex.ssd.preflight import check_ssd_tier
from miniflex.ssd.store import rank_dirs
from tests.conftest import MountFS

SLOT = 64 << 10
DIGEST = bytes(range(16))


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def refusal(dirs: list[Path], ssd_bytes: int, slot: int | None = SLOT) -> ConfigError:
    before = {d: listing(d) for d in dirs}
    with pytest.raises(ConfigError) as info:
        check_ssd_tier([str(d) for d in dirs], ssd_bytes, slot, lock_wait_s=0.3)
    assert {d: listing(d) for d in dirs} == before  # probes are removed again
    assert "\n" not in str(info.value)  # one line
    return info.value


def test_a_usable_directory_passes_and_keeps_nothing(direct_dir: Path) -> None:
    found = check_ssd_tier([str(direct_dir)], 10 * SLOT, SLOT)
    assert found.file_bytes == 10 * SLOT and found.free_bytes[str(direct_dir)] > 0
    assert listing(direct_dir) == []
    assert "O_DIRECT ok" in found.describe()


def test_read_only_file_system_is_a_config_error_not_errno_30(mount_fs: MountFS) -> None:
    ro = mount_fs(8, read_only=True)
    err = refusal([ro], 1 << 20)
    assert err.key == "ssd_dirs" and err.value == str(ro)
    assert "read-only file system" in str(err) and "Errno" not in str(err)


def test_too_little_free_space_says_how_much_in_fitting_units(mount_fs: MountFS) -> None:
    small = mount_fs(8)
    err = refusal([small], 48 << 20)
    assert err.key == "ssd_bytes" and err.value == "48.0 MiB"
    assert " MiB free but the SSD tier needs " in str(err) and "0.0 GiB" not in str(err)
    assert "set it to at most " in str(err)


def test_a_file_system_without_o_direct_is_named(mount_fs: MountFS) -> None:
    ram = mount_fs(kind="ramfs")
    err = refusal([ram], 1 << 20)
    assert err.key == "ssd_dirs" and "(ramfs) refuses O_DIRECT" in str(err)


def test_a_directory_a_live_store_uses_is_refused_with_its_pid(
    direct_dir: Path, backend: IOBackend
) -> None:
    rd = rank_dirs([str(direct_dir)], 0)[0]
    os.mkdir(rd)
    with SSDStore([rd], 10 * SLOT, SLOT, DIGEST, backend):
        err = refusal([direct_dir], 10 * SLOT)
    assert err.key == "ssd_dirs" and f"pid {os.getpid()}" in str(err)
    check_ssd_tier([str(direct_dir)], 10 * SLOT, SLOT)  # free again once it closed


def test_a_store_that_is_closing_gets_time_to_let_go(direct_dir: Path, backend: IOBackend) -> None:
    """An engine closed just before the next one starts: its workers exit a moment later."""
    rd = rank_dirs([str(direct_dir)], 0)[0]
    os.mkdir(rd)
    store = SSDStore([rd], 10 * SLOT, SLOT, DIGEST, backend)
    threading.Timer(0.5, store.close).start()
    check_ssd_tier([str(direct_dir)], 10 * SLOT, SLOT, lock_wait_s=30)


def test_an_existing_data_file_counts_as_room(mount_fs: MountFS, backend: IOBackend) -> None:
    """A restart on the same directory needs no second copy of the space it already holds."""
    small = mount_fs(16)
    rd = rank_dirs([str(small)], 0)[0]
    os.mkdir(rd)
    size = 128 * SLOT  # 8 MiB of a 16 MiB disk (12.6 MiB usable): no room for it twice
    SSDStore([rd], size, SLOT, DIGEST, backend).close()
    check_ssd_tier([str(small)], size, SLOT)


def test_the_data_files_of_a_hybrid_models_groups_count_as_room(
    mount_fs: MountFS, backend: IOBackend
) -> None:
    """A hybrid model's KV cache groups keep a store each, in ``<dir>/group<g>``."""
    small = mount_fs(16)
    size = 128 * SLOT  # two groups of 4 MiB: 8 MiB of a 16 MiB disk, no room for it twice
    for g in range(2):
        os.mkdir(small / f"group{g}")
        rd = rank_dirs([str(small / f"group{g}")], 0)[0]
        os.mkdir(rd)
        SSDStore([rd], size // 2, SLOT, DIGEST, backend).close()
    check_ssd_tier([str(small)], size, SLOT)


def test_an_ssd_tier_below_one_chunk_per_directory(direct_dir: Path) -> None:
    err = refusal([direct_dir], SLOT // 2)
    assert err.key == "ssd_bytes" and "holds no chunk per directory" in str(err)
    assert "at least 64.0 KiB" in str(err)
