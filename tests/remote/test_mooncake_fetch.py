"""A load's fetches and the start-up probe, several at once, on a real Mooncake Store;
as ``test_fetch`` for Redis."""

from __future__ import annotations

import numpy as np
import pytest

from miniflex.plan import RemoteCopy
from miniflex.pool import HostPool
from miniflex.remote.fetch import RemoteFetcher
from miniflex.remote.local_mooncake import LocalMooncake
from miniflex.remote.mooncake_store import WINDOW_BYTES
from miniflex.remote.probe import PROBE_KEY, probe_fetch_bandwidth
from miniflex.types import SlotId
from tests.remote.conftest import key, payload
from tests.remote.mooncake_support import NEEDS_MOONCAKE, mc_store, mooncake

pytestmark = NEEDS_MOONCAKE
__all__ = ["mooncake"]  # the fixture

SLOT = 1 << 20


@pytest.mark.parametrize("streams", [1, 4])
def test_every_slot_gets_its_own_chunk_and_misses_are_reported(
    mooncake: LocalMooncake, streams: int
) -> None:
    s = mc_store(mooncake.url)
    assert s.check()
    pool = HostPool(12, SLOT)
    for i in range(10):
        assert s.put(key(i), payload(SLOT, seed=i))
    copies = [RemoteCopy(key(i), SlotId(11 - i)) for i in range(12)]  # keys 10, 11 missing
    fetcher = RemoteFetcher(s, pool, streams=streams)
    failed, seconds = fetcher.fetch(copies)
    fetcher.close()
    assert failed == {key(10), key(11)} and seconds > 0
    for i in range(10):
        assert pool.slot(SlotId(11 - i)).tobytes() == payload(SLOT, seed=i)
    s.close()


def test_the_probe_fetches_as_many_at_once_as_a_load_and_cleans_up(
    mooncake: LocalMooncake,
) -> None:
    s = mc_store(mooncake.url)
    assert s.check()
    pool = HostPool(3, SLOT)
    pool.array[:] = np.frombuffer(payload(3 * SLOT), dtype=np.uint8).reshape(3, SLOT)
    first = pool.slot(SlotId(0)).tobytes()
    fetcher = RemoteFetcher(s, pool, streams=4)
    bps = probe_fetch_bandwidth(fetcher)  # 4 streams, 3 slots: 3 at once
    fetcher.close()
    assert bps is not None and bps > 0
    assert all(pool.slot(SlotId(i)).tobytes() == first for i in range(3))  # the probe's bytes
    assert s.exists([PROBE_KEY]) == [False]
    s.close()


def test_staging_stays_within_a_window_per_stream(mooncake: LocalMooncake) -> None:
    """Small chunks, many to a window: the buffers a load's fetch keeps stay within one
    window of WINDOW_BYTES per stream (each rounded up to 64 KiB, not to 1 MiB)."""
    s = mc_store(mooncake.url)
    assert s.check()
    chunk, count, streams = 300 << 10, 240, 4  # 70 MB: several windows per stream
    pool = HostPool(count, chunk)
    for i in range(count):
        assert s.put(key(i), payload(chunk, seed=i))
    fetcher = RemoteFetcher(s, pool, streams=streams)
    failed, _ = fetcher.fetch([RemoteCopy(key(i), SlotId(i)) for i in range(count)])
    fetcher.close()
    assert not failed
    assert all(pool.slot(SlotId(i)).tobytes() == payload(chunk, seed=i) for i in range(count))
    windows = streams + 1  # the fetches' windows, and the puts' buffer
    assert 0 < s.staging_bytes <= windows * (WINDOW_BYTES + (64 << 10) * 128)
    s.close()
