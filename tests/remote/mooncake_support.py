"""Fixtures for the Mooncake Store tests: a private ``mooncake_master`` and holder per test.

``scripts/test.sh`` installs Mooncake's wheel (extra ``mooncake``) and ``libibverbs1``;
where the client does not import, these tests are skipped with the reason. Test modules
import the ``mooncake`` fixture from here and carry ``NEEDS_MOONCAKE`` as ``pytestmark``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from miniflex.remote.local_mooncake import LocalMooncake, mooncake_missing
from tests.remote.conftest import NS_A

if TYPE_CHECKING:
    from miniflex.remote.mooncake_store import MooncakeStore

MISSING = mooncake_missing()
NEEDS_MOONCAKE = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


@pytest.fixture
def mooncake(tmp_path: Path) -> Iterator[LocalMooncake]:
    """A private master and one holder (512 MiB), killed when the test ends."""
    with LocalMooncake(tmp_path / "mooncake") as store:
        yield store


def mc_store(url: str, namespace: bytes = NS_A, **options: object) -> MooncakeStore:
    """A store with a short retry window and a generous timeout, as ``conftest.store``."""
    from miniflex.remote.mooncake_store import MooncakeStore

    options = {"timeout_s": 5.0, "retry_s": 0.3, **options}
    return MooncakeStore(url, namespace, **options)  # type: ignore[arg-type]


def raw_client(server: LocalMooncake) -> Any:
    """A plain Mooncake client of ``server``, to write what MiniFlex never would."""
    from mooncake.store import MooncakeDistributedStore

    client = MooncakeDistributedStore()
    rc = client.setup(
        "127.0.0.1",
        server.metadata_url,
        0,
        64 << 20,
        "tcp",
        "",
        f"127.0.0.1:{server.master_port}",
    )
    assert rc == 0, rc
    return client
