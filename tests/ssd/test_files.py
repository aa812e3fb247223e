"""open_direct: private, preallocated O_DIRECT files and readable refusals."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

import pytest

from miniflex.errors import IOBackendError
from miniflex.ssd import open_direct

MIB = 1 << 20


def test_new_file_is_private_preallocated_and_direct(direct_dir: Path) -> None:
    path = direct_dir / "tier.dat"
    fd = open_direct(path, 8 * MIB)
    try:
        st = os.fstat(fd)
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_size == 8 * MIB
        assert st.st_blocks * 512 >= 8 * MIB  # allocated, not sparse
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR
    finally:
        os.close(fd)


def test_reopening_grows_but_never_shrinks(direct_dir: Path) -> None:
    path = direct_dir / "tier.dat"
    os.close(open_direct(path, MIB))
    os.close(open_direct(path, 4 * MIB, create=False))
    assert path.stat().st_size == 4 * MIB
    os.close(open_direct(path, MIB, create=False))
    assert path.stat().st_size == 4 * MIB


def test_more_than_the_free_space_is_a_readable_enospc(direct_dir: Path) -> None:
    vfs = os.statvfs(direct_dir)
    too_big = (vfs.f_bavail * vfs.f_frsize // 4096 + (1 << 28)) * 4096  # free + 1 TiB
    path = direct_dir / "huge.dat"
    with pytest.raises(IOBackendError, match=r"iB free but [0-9.]+ TiB more are needed") as info:
        open_direct(path, too_big)
    err = info.value
    assert (err.errno, err.path, err.length) == (errno.ENOSPC, str(path), too_big)
    assert not path.exists()  # checked before creating anything


def test_file_system_without_o_direct_is_named() -> None:
    # Character devices, like ramfs files, lack FMODE_CAN_ODIRECT: open(2) says EINVAL.
    with pytest.raises(IOBackendError, match="does not support O_DIRECT") as info:
        open_direct("/dev/null", 0, create=False)
    assert info.value.errno == errno.EINVAL


def test_missing_file_without_create(direct_dir: Path) -> None:
    with pytest.raises(IOBackendError) as info:
        open_direct(direct_dir / "absent.dat", MIB, create=False)
    assert info.value.errno == errno.ENOENT


def test_size_must_be_a_multiple_of_4k(direct_dir: Path) -> None:
    with pytest.raises(ValueError, match="multiple of 4096"):
        open_direct(direct_dir / "odd.dat", 1000)
