"""Choosing a backend: forced names, unknown names, auto-detection and the real fallback path."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from miniflex.errors import ConfigError
from miniflex.ssd import BackendUnavailableError, IOOp, make_backend, open_direct
from tests.ssd.conftest import aligned, uring_unavailable_reason

TOO_DEEP = 1 << 16  # above IORING_MAX_ENTRIES (32768): io_uring_setup really fails, EINVAL


def test_threads_can_be_forced() -> None:
    with make_backend("threads", queue_depth=8) as io:
        assert (io.name, io.queue_depth) == ("threads", 8)


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="'auto', 'io_uring', 'threads'") as info:
        make_backend("spdk")
    assert isinstance(info.value, ConfigError) and "spdk" in str(info.value)


def test_queue_depth_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="ssd_queue_depth=0"):
        make_backend("threads", queue_depth=0)


def test_auto_picks_io_uring_where_it_works(caplog: pytest.LogCaptureFixture) -> None:
    reason = uring_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with caplog.at_level(logging.INFO, logger="miniflex.ssd"), make_backend() as io:
        assert io.name == "io_uring"
    assert "io_uring (probed OK)" in caplog.text


def test_auto_falls_back_to_threads_when_ring_setup_fails(
    caplog: pytest.LogCaptureFixture, direct_dir: Path
) -> None:
    with caplog.at_level(logging.INFO, logger="miniflex.ssd"):
        io = make_backend("auto", queue_depth=TOO_DEEP)
    with io:
        assert io.name == "threads"
        path = str(direct_dir / "f.dat")
        fd = open_direct(path, 1 << 20)
        try:
            io.run(
                [IOOp(fd, path, 0, memoryview(aligned(1 << 20)), True)]
            )  # the fallback really works
        finally:
            os.close(fd)
    record = next(r for r in caplog.records if r.name == "miniflex.ssd")
    assert record.levelno == logging.WARNING
    assert "threads, because io_uring is unavailable" in record.getMessage()
    assert "io_uring_setup(entries=65536) failed: Invalid argument" in record.getMessage()


def test_forced_io_uring_explains_why_it_is_unavailable() -> None:
    with pytest.raises(BackendUnavailableError, match="queue depth or a flag is out of range"):
        make_backend("io_uring", queue_depth=TOO_DEEP)
