"""Fixtures shared by every test folder."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def supports_direct(directory: Path) -> bool:
    probe = directory / ".odirect_probe"
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    os.close(fd)
    probe.unlink()
    return True


@pytest.fixture
def direct_dir(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory whose file system accepts O_DIRECT (tmp_path, else /var/tmp)."""
    if supports_direct(tmp_path):
        yield tmp_path
        return
    fallback = Path(tempfile.mkdtemp(prefix="miniflex-ssd-", dir="/var/tmp"))
    try:
        if not supports_direct(fallback):
            pytest.skip("neither the pytest tmp dir nor /var/tmp supports O_DIRECT")
        yield fallback
    finally:
        shutil.rmtree(fallback, ignore_errors=True)
