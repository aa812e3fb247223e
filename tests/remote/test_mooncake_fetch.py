"""A load's fetches and the start-up probe, several at once, on a real Mooncake Store;
as ``test_fetch`` for Redis."""

from __future__ import annotations

import numpy as np
import pytest

from miniflex.plan import RemoteCopy
from miniflex.pool import HostPool
from miniflex.remote.fetch import RemoteFetcher
from miniflex.remote.local_mooncake import LocalMooncake
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
