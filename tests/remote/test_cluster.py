"""The remote tier on a real Redis Cluster (three primaries on this machine, no replicas).

Chunks spread over the primaries by slot, two engines share a prompt through the cluster,
wrong credentials are refused at start-up, and a primary killed mid-run costs failed calls,
never an exception or a stall, until it is back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("redis", reason="the redis client is missing: pip install -e '.[remote]'")

import redis

from miniflex.errors import RemoteError
from miniflex.remote.local_server import LocalCluster
from tests.remote.conftest import NEEDS_SERVER, NS_A, key, payload, store
from tests.remote.test_connector_flow import CHUNK, CHUNKS, computed, engine, served, tokens
from tests.remote.test_connector_flow import totals as engine_totals

pytestmark = NEEDS_SERVER

PASSWORD = "cluster-secret"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", nodes=3, password=PASSWORD) as c:
        yield c


def keys_per_node(c: LocalCluster) -> list[int]:
    counts = []
    for s in c.servers:
        client = redis.Redis(port=s.port, password=PASSWORD)
        counts.append(int(client.dbsize()))
        client.close()
    return counts


def test_chunks_round_trip_and_spread_over_every_primary(cluster: LocalCluster) -> None:
    st = store(cluster.url, NS_A, password=PASSWORD)
    assert st.check()
    chunks = {key(i): payload(64 << 10, seed=i) for i in range(24)}
    assert all(st.put(k, v) for k, v in chunks.items())
    assert st.exists([*chunks, key(99)]) == [True] * 24 + [False]
    assert all(st.get(k) == v for k, v in chunks.items())
    assert all(n > 0 for n in keys_per_node(cluster)), keys_per_node(cluster)
    assert sum(keys_per_node(cluster)) == 24
    st.close()


def test_wrong_credentials_are_refused_with_the_keys_to_fix(cluster: LocalCluster) -> None:
    with pytest.raises(RemoteError, match="remote_password"):
        store(cluster.url, NS_A, password="wrong").check()


def test_a_killed_primary_fails_calls_fast_until_it_is_back(cluster: LocalCluster) -> None:
    st = store(cluster.url, NS_A, password=PASSWORD, timeout_s=1.0, retry_s=0.3)
    chunks = {key(i): payload(4096, seed=i) for i in range(12)}
    assert all(st.put(k, v) for k, v in chunks.items())
    cluster.servers[1].kill()
    t0 = time.monotonic()
    got = [st.get(k) for k in chunks]  # never raises; the dead primary's chunks are misses
    assert time.monotonic() - t0 < 5.0
    assert None in got and all(g in (None, chunks[k]) for k, g in zip(chunks, got, strict=True))
    cluster.servers[1].start()  # same port and nodes.conf: it rejoins, empty (no persistence)
    fresh = {key(100 + i): payload(4096, seed=100 + i) for i in range(12)}

    def serves() -> bool:
        return all(st.put(k, v) for k, v in fresh.items()) and all(
            st.get(k) == v for k, v in fresh.items()
        )

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not serves():
        time.sleep(0.3)
    assert serves(), "the tier did not come back"
    survivors = [k for k, g in zip(chunks, got, strict=True) if g is not None]
    assert all(st.get(k) == chunks[k] for k in survivors)
    assert st.stats().reconnects >= 1
    st.close()


def test_a_second_engine_loads_through_the_cluster_what_the_first_computed(
    tmp_path: Path, cluster: LocalCluster
) -> None:
    model, url = tmp_path / "model", cluster.url
    computed(model, url, seed=3, remote_password=PASSWORD)
    b = engine(model, url, remote_password=PASSWORD)
    assert served(b, "b", tokens(3)) == CHUNKS * CHUNK  # loaded bytes checked exactly
    assert engine_totals(b)["hit_tokens_remote"] == CHUNKS * CHUNK
    assert sum(keys_per_node(cluster)) == CHUNKS
    b.worker.shutdown()


def test_fetches_run_on_own_connections_from_each_chunks_primary(
    cluster: LocalCluster,
) -> None:
    """A load's fetch reads every chunk from the primary owning its slot, exactly, with one
    stream per primary; a missing key is a miss."""
    from miniflex.plan import RemoteCopy
    from miniflex.pool import HostPool
    from miniflex.remote.cluster_wire import ClusterWire
    from miniflex.remote.fetch import RemoteFetcher
    from miniflex.types import SlotId

    slot_bytes = 256 << 10
    st = store(cluster.url, NS_A, password=PASSWORD, part_bytes=64 << 10)
    assert isinstance(st._wire, ClusterWire)
    chunks = {key(i): payload(slot_bytes, seed=i) for i in range(18)}
    assert all(st.put(k, v) for k, v in chunks.items())
    keys = [*chunks, key(999)]
    lanes = st.lanes(keys)
    assert lanes is not None and len(set(lanes)) == 3  # every primary holds some
    ports = {s.port for s in cluster.servers}
    assert {port for _, port in lanes} == ports
    pool = HostPool(len(keys), slot_bytes)
    fetcher = RemoteFetcher(st, pool, streams=3)
    failed, _ = fetcher.fetch([RemoteCopy(k, SlotId(i)) for i, k in enumerate(keys)])
    fetcher.close()
    assert failed == {key(999)}
    for i, k in enumerate(chunks):
        assert bytes(pool.slot(SlotId(i))) == chunks[k]
    stats = st.stats()
    assert stats.hits == 18 and stats.misses == 1 and stats.corrupt == 0
    st.close()


def test_a_stale_slot_map_costs_misses_then_is_learned_again(cluster: LocalCluster) -> None:
    """A primary asked for a slot it does not serve answers MOVED: that chunk is a miss
    (recomputed, never wrong bytes) and the next fetch routes by a fresh slot map."""
    st = store(cluster.url, NS_A, password=PASSWORD)
    chunks = {key(i): payload(64 << 10, seed=i) for i in range(9)}
    assert all(st.put(k, v) for k, v in chunks.items())
    client = st._client.built()
    manager = client.nodes_manager
    wrong = {}
    for k in chunks:  # point every slot at another primary, as after a resharding
        slot = client.keyslot(st.redis_key(k))
        owner = manager.slots_cache[slot][0]
        other = next(n for n in manager.nodes_cache.values() if n.name != owner.name)
        wrong[slot] = [other]
    manager.slots_cache.update(wrong)
    bufs = [(k, memoryview(bytearray(64 << 10))) for k in chunks]
    assert st.get_many_into(bufs) == [None] * len(bufs)
    got = st.get_many_into(bufs)
    assert got == [64 << 10] * len(bufs)
    assert all(bytes(b) == chunks[k] for k, b in bufs)
    st.close()
