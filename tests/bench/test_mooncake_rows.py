"""``bench.mooncake_wire``'s MiniFlex row: its URL, and a fetch on a private Mooncake Store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from miniflex.pool import HostPool
from miniflex.remote.local_mooncake import LocalMooncake, mooncake_missing
from miniflex.types import SlotId

pytestmark = pytest.mark.skipif(mooncake_missing() is not None, reason=mooncake_missing() or "")


def test_the_url_names_the_master_and_its_metadata_server() -> None:
    from bench.mooncake_rows import NS, mooncake_url
    from miniflex.remote.mooncake_store import MooncakeStore

    url = mooncake_url(50123, 8123)
    assert url == (
        "mooncake://127.0.0.1:50123?metadata=http://127.0.0.1:8123/metadata&protocol=tcp"
    )
    MooncakeStore(url, NS).close()  # parses it; connects to nothing


def test_staged_chunks_are_fetched_into_their_slots(tmp_path: Path) -> None:
    from bench.mooncake_rows import fetch_gbps, open_store, stage

    data = os.urandom(64 << 10)
    with LocalMooncake(tmp_path / "mooncake", 64 << 20) as server:
        stage(server.url, data, 5)
        pool, bigger = HostPool(5, len(data)), HostPool(6, len(data))
        pool.array[:] = 0
        store = open_store(server.url)
        try:
            assert fetch_gbps(store, pool, 5, streams=2) > 0
            assert all(pool.slot(SlotId(i)).tobytes() == data for i in range(5))
            with pytest.raises(RuntimeError, match="1 of 6 fetches failed"):
                fetch_gbps(store, bigger, 6, streams=1)  # chunk 6: none
        finally:
            store.close()
            pool.close()
            bigger.close()
