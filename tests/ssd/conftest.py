"""Fixtures for the SSD I/O tests: an O_DIRECT-capable directory, both backends, buffers.

Every behavioural test takes the ``backend`` fixture, so it runs once on
io_uring and once on threads (fallback parity). Tests that need io_uring
specifically use ``uring`` and are skipped, with the reason, where the kernel
refuses a ring.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator

import numpy as np
import pytest

from miniflex.ssd import BackendUnavailableError, IOBackend, ThreadBackend, UringBackend

QUEUE_DEPTH = 16


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
