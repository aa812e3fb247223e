"""Fixtures for the SSD I/O tests: an O_DIRECT-capable directory, both backends, buffers.

Every behavioural test takes the ``backend`` fixture, so it runs once on
io_uring and once on threads (fallback parity). Tests that need io_uring
specifically use ``uring`` and are skipped, with the reason, where the kernel
refuses a ring.
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from miniflex.ssd import BackendUnavailableError, IOBackend, ThreadBackend, UringBackend

QUEUE_DEPTH = 16


def _supports_direct(directory: Path) -> bool:
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
    if _supports_direct(tmp_path):
        yield tmp_path
        return
    fallback = Path(tempfile.mkdtemp(prefix="miniflex-ssd-", dir="/var/tmp"))
    try:
        if not _supports_direct(fallback):
            pytest.skip("neither the pytest tmp dir nor /var/tmp supports O_DIRECT")
        yield fallback
    finally:
        shutil.rmtree(fallback, ignore_errors=True)


def uring_unavailable_reason() -> str | None:
    try:
        UringBackend(2).close()
    except BackendUnavailableError as exc:
        return f"io_uring unavailable here: {exc}"
    return None


@pytest.fixture(params=["io_uring", "threads"])
def backend(request: pytest.FixtureRequest) -> Iterator[IOBackend]:
    if request.param == "io_uring":
        reason = uring_unavailable_reason()
        if reason:
            pytest.skip(reason)
        io: IOBackend = UringBackend(QUEUE_DEPTH)
    else:
        io = ThreadBackend(QUEUE_DEPTH)
    yield io
    io.close()


@pytest.fixture
def uring() -> Iterator[UringBackend]:
    reason = uring_unavailable_reason()
    if reason:
        pytest.skip(reason)
    io = UringBackend(QUEUE_DEPTH)
    yield io
    io.close()


def aligned(nbytes: int) -> np.ndarray:
    """A zeroed, page-aligned, writable byte array (anonymous mmap, like HostPool)."""
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)


def random_bytes(nbytes: int, seed: int) -> np.ndarray:
    """``nbytes`` (a multiple of 8) of reproducible noise in a page-aligned array."""
    out = aligned(nbytes)
    words = np.random.default_rng(seed).integers(0, 2**63, nbytes // 8, dtype=np.uint64)
    out.view(np.uint64)[:] = words
    return out
