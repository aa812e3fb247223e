"""Fixtures shared by every test folder."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from miniflex.ssd.files import supports_direct


def pytest_report_header() -> str:
    """Which vLLM the run imports, and from where (the version matrix checks this line)."""
    try:
        import vllm
    except ImportError:
        return "vllm: not installed"
    return f"vllm {vllm.__version__} from {Path(vllm.__file__).parent}"


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
