"""Batches of fetches through a real Redis: windows, misses and damage mid-batch, old values."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from miniflex.keys import FORMAT_VERSION
from miniflex.remote.local_server import LocalServer
from tests.remote.conftest import CHUNK_BYTES, NEEDS_SERVER, NS_A, key, payload, store

redis = pytest.importorskip(
    "redis", reason="the redis client is missing: pip install -e '.[remote]'"
)
PART_BYTES = pytest.importorskip("miniflex.remote.redis_store").PART_BYTES
pytestmark = NEEDS_SERVER


def test_a_batch_over_several_windows_serves_each_chunk_or_a_miss_in_order(
    server: LocalServer,
) -> None:
    """12 chunks (4 windows of 3) with a miss, a damaged value and a string in the middle:
    every other chunk byte for byte, each item reported once in order, the damaged ones
    deleted, and the connection still in step for the next batch."""
    raw = redis.Redis.from_url(server.url)
    slots = np.zeros((12, CHUNK_BYTES), dtype=np.uint8)
    with store(server.url) as s:
        for i in range(12):
            if i != 4:  # chunk 4 was never stored: a miss
                assert s.put(key(i), payload(CHUNK_BYTES, seed=i))
        raw.hdel(s.redis_key(key(6)), "2")  # a part lost
        raw.delete(s.redis_key(key(9)))
        raw.set(s.redis_key(key(9)), b"not a hash")  # WRONGTYPE
        order: list[int] = []
        items = [(key(i), memoryview(slots[i])) for i in range(12)]
        got = s.get_many_into(items, done=lambda i, n: order.append(i))
        bad = {4, 6, 9}
        assert got == [None if i in bad else CHUNK_BYTES for i in range(12)]
        assert order == list(range(12))
        for i in set(range(12)) - bad:
            assert slots[i].tobytes() == payload(CHUNK_BYTES, seed=i), i
        stats = s.stats()
        assert (stats.hits, stats.misses, stats.corrupt, stats.errors) == (9, 1, 2, 0)
        assert raw.exists(s.redis_key(key(6)), s.redis_key(key(9))) == 0
        assert not stats.down
        slots[:] = 0
        assert s.get_many_into(items[:3]) == [CHUNK_BYTES] * 3  # the same connection again
        assert slots[2].tobytes() == payload(CHUNK_BYTES, seed=2)
    raw.close()


def test_a_value_written_with_the_first_envelope_version_is_still_served(
    server: LocalServer,
) -> None:
    """An older MiniFlex wrote version 1 (zlib's CRC32): it keeps serving after an upgrade."""
    data = payload(3 * PART_BYTES + 123, seed=5)
    parts = [data[at : at + PART_BYTES] for at in range(0, len(data), PART_BYTES)]
    header = struct.pack(
        "<4sHH16s16sQII8x",
        b"MFXR",
        1,
        FORMAT_VERSION,
        NS_A,
        key(1).to_bytes(16, "little"),
        len(data),
        zlib.crc32(data),
        len(parts),
    )
    raw = redis.Redis.from_url(server.url)
    with store(server.url) as s:
        fields = {b"h": header, **{str(i).encode(): p for i, p in enumerate(parts)}}
        raw.hset(s.redis_key(key(1)), mapping=fields)
        slot = np.zeros(len(data), dtype=np.uint8)
        assert s.get_into(key(1), memoryview(slot)) == len(data)
        assert slot.tobytes() == data and s.get(key(1)) == data
        raw.hset(s.redis_key(key(1)), "1", b"\0" * PART_BYTES)  # and its checksum still counts
        assert s.get_into(key(1), memoryview(slot)) is None and s.stats().corrupt == 1
    raw.close()
