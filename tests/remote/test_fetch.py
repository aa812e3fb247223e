"""A load's fetches and the start-up probe, several at once on a real redis-server."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("redis", reason="the redis client is missing: pip install -e '.[remote]'")

from miniflex.plan import RemoteCopy
from miniflex.pool import HostPool
from miniflex.remote.fetch import RemoteFetcher
from miniflex.remote.local_server import LocalServer
from miniflex.remote.probe import PROBE_KEY, probe_fetch_bandwidth
from miniflex.types import SlotId
from tests.remote.conftest import NEEDS_SERVER, key, payload, store

pytestmark = NEEDS_SERVER

SLOT = 1 << 20


@pytest.mark.parametrize("streams", [1, 4])
def test_every_slot_gets_its_own_chunk_and_misses_are_reported(
    server: LocalServer, streams: int
) -> None:
    s = store(server.url)
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


def test_the_probe_fetches_as_many_at_once_as_a_load_and_cleans_up(server: LocalServer) -> None:
    s = store(server.url)
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


def test_a_stream_that_raises_is_reported_only_once_the_others_have_ended(
    server: LocalServer,
) -> None:
    """Of two streams, the one that raises ends first; the error reaches the caller only
    after the other stream has written its slots and told of each, so that nothing writes
    a slot after the load is reported failed."""
    import threading
    import time

    s = store(server.url)
    pool = HostPool(4, SLOT)
    for i in range(4):
        assert s.put(key(i), payload(SLOT, seed=i))
    real = type(s).get_many_into
    told: list[int] = []
    lock = threading.Lock()

    def one_share_raises(self, items, done=None):  # type: ignore[no-untyped-def]
        if items[0][0] == key(0):
            raise RuntimeError("a bug in one stream")
        time.sleep(0.2)  # the other stream is still fetching when the first raises
        return real(self, items, done)

    def arrived(copy: RemoteCopy, ok: bool) -> None:
        with lock:
            told.append(int(copy.cpu))

    type(s).get_many_into = one_share_raises  # type: ignore[method-assign]
    try:
        fetcher = RemoteFetcher(s, pool, streams=2)
        copies = [RemoteCopy(key(i), SlotId(i)) for i in range(4)]
        with pytest.raises(RuntimeError, match="a bug in one stream"):
            fetcher.fetch(copies, arrived)
        with lock:
            assert sorted(told) == [1, 3]  # the other stream's slots, all told before
        fetcher.close()
    finally:
        type(s).get_many_into = real  # type: ignore[method-assign]
    s.close()
