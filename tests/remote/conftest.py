"""Fixtures for the remote-store tests: a real ``redis-server`` per test, on a free port.

``scripts/test.sh`` installs ``redis-server`` and ``valkey-server`` (Debian's
packages) and ``scripts/setup.sh`` the ``redis`` client; where either is missing
these tests are skipped with the reason. Tests that take the ``server`` fixture
run against each of the two servers. Every server is a private child process (no persistence, 1 GB,
``allkeys-lru``) killed when its test ends.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from miniflex.remote.local_server import SERVER_BINARIES, LocalServer, server_binary
from miniflex.types import ChunkKey

if TYPE_CHECKING:
    from miniflex.remote.redis_store import RedisStore

NEEDS_SERVER = pytest.mark.skipif(
    server_binary() is None, reason="redis-server is not installed (scripts/test.sh installs it)"
)
"""Every test module here carries it as ``pytestmark``, after ``importorskip("redis")``."""

CHUNK_BYTES = 64 * 144 * 1024
"""A chunk of an 8B model (64 tokens of 144 KiB): 9.4 MB."""
NS_A = bytes(range(16))
NS_B = bytes(range(1, 17))


@pytest.fixture(params=SERVER_BINARIES)
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalServer]:
    """A private server: Redis, then Valkey (skipped where that one is not installed)."""
    if server_binary(request.param) is None:
        pytest.skip(f"{request.param} is not installed (scripts/test.sh installs it)")
    with LocalServer(tmp_path / "server", binary=request.param) as srv:
        yield srv


def store(url: str, namespace: bytes = NS_A, **options: object) -> RedisStore:
    """A store with a short retry window, so that fault tests run quickly; the timeout is
    generous (a TLS handshake on a busy 2-core machine can take a second), except where a
    test sets it."""
    from miniflex.remote.redis_store import RedisStore

    options = {"timeout_s": 5.0, "retry_s": 0.3, **options}
    return RedisStore(url, namespace, **options)  # type: ignore[arg-type]


def payload(nbytes: int, seed: int = 0) -> bytes:
    """``nbytes`` of pseudo-random bytes, distinct per ``seed``, so that a mix-up cannot pass."""
    return random.Random(seed).randbytes(nbytes)


def key(i: int) -> ChunkKey:
    return ChunkKey((0x5EED << 96) | i)
