"""Chunks through a real Redis: byte-exact round trips, namespaces apart, corruption caught."""

from __future__ import annotations

import numpy as np
import pytest

from miniflex.config import MiniFlexConfig
from miniflex.remote import open_remote_store
from miniflex.remote.local_server import LocalServer
from tests.remote.conftest import CHUNK_BYTES, NEEDS_SERVER, NS_A, NS_B, key, payload, store

redis = pytest.importorskip(
    "redis", reason="the redis client is missing: pip install -e '.[remote]'"
)
PART_BYTES = pytest.importorskip("miniflex.remote.redis_store").PART_BYTES
pytestmark = NEEDS_SERVER


@pytest.mark.parametrize(
    "nbytes", [CHUNK_BYTES, 3 * PART_BYTES, PART_BYTES + 1, 4096, 1, 0], ids=str
)
def test_values_come_back_byte_for_byte(server: LocalServer, nbytes: int) -> None:
    with store(server.url) as s:
        data = payload(nbytes, seed=nbytes)
        assert s.put(key(1), data)
        assert s.get(key(1)) == data
        stats = s.stats()
        assert (stats.puts, stats.put_bytes, stats.hits, stats.hit_bytes) == (1, nbytes, 1, nbytes)


def test_get_into_fills_a_slot_and_returns_the_length(server: LocalServer) -> None:
    slot = np.full(CHUNK_BYTES + 4096, 0xAB, dtype=np.uint8)  # a CPU slot, a little larger
    with store(server.url) as s:
        data = payload(CHUNK_BYTES - 100, seed=9)
        assert s.put(key(1), data)
        assert s.get_into(key(1), memoryview(slot)) == len(data)
        assert slot[: len(data)].tobytes() == data
        assert (slot[len(data) :] == 0xAB).all()  # nothing past the value is touched
        assert s.get_into(key(2), memoryview(slot)) is None and s.stats().misses == 1


def test_a_value_longer_than_the_slot_is_refused_as_corrupt(server: LocalServer) -> None:
    with store(server.url) as s:
        assert s.put(key(1), payload(8192))
        assert s.get_into(key(1), bytearray(4096)) is None
        assert s.stats().corrupt == 1 and s.exists([key(1)]) == [False]


def test_buffers_are_stored_without_a_copy_by_the_caller(server: LocalServer) -> None:
    data = bytearray(payload(CHUNK_BYTES, seed=7))
    with store(server.url) as s:
        assert s.put(key(1), memoryview(data)[: CHUNK_BYTES // 2])
        assert s.get(key(1)) == bytes(data[: CHUNK_BYTES // 2])


def test_exists_get_and_delete_agree(server: LocalServer) -> None:
    with store(server.url) as s:
        assert s.put(key(1), b"one") and s.put(key(3), b"three")
        assert s.exists([key(1), key(2), key(3)]) == [True, False, True]
        assert s.exists([]) == []
        assert s.get(key(2)) is None
        assert s.delete(key(1)) and not s.delete(key(1))
        assert s.exists([key(1), key(3)]) == [False, True]
        assert (s.stats().misses, s.stats().lookups, s.stats().errors) == (1, 5, 0)


def test_a_put_replaces_the_previous_value_entirely(server: LocalServer) -> None:
    with store(server.url) as s:
        assert s.put(key(1), payload(CHUNK_BYTES, seed=1))
        assert s.put(key(1), b"short")  # fewer parts: none of the old ones may linger
        assert s.get(key(1)) == b"short"


def test_two_namespaces_never_see_each_others_values(server: LocalServer) -> None:
    with store(server.url, NS_A) as a, store(server.url, NS_B) as b:
        data_a, data_b = payload(CHUNK_BYTES, seed=1), payload(CHUNK_BYTES, seed=2)
        assert a.put(key(1), data_a)
        assert b.exists([key(1)]) == [False] and b.get(key(1)) is None
        assert b.put(key(1), data_b)
        assert a.get(key(1)) == data_a and b.get(key(1)) == data_b
        assert a.delete(key(1))
        assert b.get(key(1)) == data_b
        assert a.stats().corrupt == b.stats().corrupt == 0


def test_a_value_copied_into_another_namespace_is_refused(server: LocalServer) -> None:
    raw = redis.Redis.from_url(server.url)
    with store(server.url, NS_A) as a, store(server.url, NS_B) as b:
        assert a.put(key(1), payload(4096))
        raw.copy(a.redis_key(key(1)), b.redis_key(key(1)))  # e.g. an operator's mistake
        raw.copy(a.redis_key(key(1)), a.redis_key(key(2)))  # or another chunk's name
        assert b.get(key(1)) is None and a.get(key(2)) is None
        assert b.stats().corrupt == 1 and a.stats().corrupt == 1
        assert a.get(key(1)) == payload(4096)
    raw.close()


def _flip_a_byte(raw: redis.Redis, name: str) -> None:
    part = bytearray(raw.hget(name, "1"))
    part[12345] ^= 0x40
    raw.hset(name, "1", bytes(part))


CORRUPTIONS = {
    "flipped byte": _flip_a_byte,
    "truncated part": lambda raw, name: raw.hset(name, "2", b"short"),
    "missing part": lambda raw, name: raw.hdel(name, "3"),
    "extra part": lambda raw, name: raw.hset(name, "99", b"x"),
    "no header": lambda raw, name: raw.hdel(name, "h"),
    "garbage header": lambda raw, name: raw.hset(name, "h", b"\0" * 64),
    "wrong type": lambda raw, name: raw.set(name, b"not a hash"),
}


@pytest.mark.parametrize("reader", ["get", "get_into"])
@pytest.mark.parametrize("corrupt", list(CORRUPTIONS), ids=str)
def test_a_corrupt_value_is_never_served_and_is_deleted(
    server: LocalServer, corrupt: str, reader: str
) -> None:
    raw = redis.Redis.from_url(server.url)
    with store(server.url) as s:
        data = payload(CHUNK_BYTES, seed=3)
        assert s.put(key(1), data) and s.put(key(2), data)
        CORRUPTIONS[corrupt](raw, s.redis_key(key(1)))
        if reader == "get":
            assert s.get(key(1)) is None
        else:
            assert s.get_into(key(1), bytearray(CHUNK_BYTES)) is None
        assert raw.exists(s.redis_key(key(1))) == 0  # deleted, so the next lookup misses
        assert s.stats().corrupt == 1
        assert s.get(key(1)) is None and s.stats().misses == 1
        assert s.get(key(2)) == data  # a neighbour is untouched
    raw.close()


def test_the_store_opens_from_the_config(server: LocalServer) -> None:
    cfg = MiniFlexConfig.from_dict({"remote_url": server.url, "remote_timeout_s": "0.5"}, env={})
    with open_remote_store(cfg, NS_A) as s:  # type: ignore[union-attr]
        assert s.check()
        assert s.put(key(1), b"via config") and s.get(key(1)) == b"via config"
    assert open_remote_store(MiniFlexConfig.from_dict({}, env={}), NS_A) is None
