"""Fixtures shared by every test folder."""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def o_direct_dir(preferred: Path) -> Iterator[Path]:
    """``preferred`` if its file system accepts O_DIRECT, else a fresh dir in /var/tmp."""
    if supports_direct(preferred):
        yield preferred
        return
    fallback = Path(tempfile.mkdtemp(prefix="miniflex-ssd-", dir="/var/tmp"))
    try:
        if not supports_direct(fallback):
            pytest.skip(f"neither {preferred} nor /var/tmp supports O_DIRECT")
        yield fallback
    finally:
        shutil.rmtree(fallback, ignore_errors=True)


@pytest.fixture
def direct_dir(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory whose file system accepts O_DIRECT (tmp_path, else /var/tmp)."""
    with o_direct_dir(tmp_path) as path:
        yield path
