"""Chunks through a real Mooncake Store (a master and a holder): byte-exact round trips,
namespaces apart, corruption caught, as ``test_roundtrip`` for Redis."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from miniflex.config import MiniFlexConfig
from miniflex.remote import open_remote_store
from miniflex.remote.envelope import HEADER_BYTES
from miniflex.remote.local_mooncake import LocalMooncake
from tests.remote.conftest import CHUNK_BYTES, NS_A, NS_B, key, payload
from tests.remote.mooncake_support import NEEDS_MOONCAKE, mc_store, mooncake, raw_client

pytestmark = NEEDS_MOONCAKE
__all__ = ["mooncake"]  # the fixture


@pytest.mark.parametrize("nbytes", [CHUNK_BYTES, (1 << 20) + 1, 4096, 1, 0], ids=str)
def test_values_come_back_byte_for_byte(mooncake: LocalMooncake, nbytes: int) -> None:
    with mc_store(mooncake.url) as s:
        assert s.check()
        data = payload(nbytes, seed=nbytes)
        assert s.put(key(1), data)
        assert s.get(key(1)) == data
        stats = s.stats()
        assert (stats.puts, stats.put_bytes, stats.hits, stats.hit_bytes) == (1, nbytes, 1, nbytes)


def test_get_into_fills_a_slot_and_returns_the_length(mooncake: LocalMooncake) -> None:
    slot = np.full(CHUNK_BYTES + 4096, 0xAB, dtype=np.uint8)  # a CPU slot, a little larger
    with mc_store(mooncake.url) as s:
        data = payload(CHUNK_BYTES - 100, seed=9)
        assert s.put(key(1), data)
        assert s.get_into(key(1), memoryview(slot)) == len(data)
        assert slot[: len(data)].tobytes() == data
        assert (slot[len(data) :] == 0xAB).all()  # nothing past the value is touched
        assert s.get_into(key(2), memoryview(slot)) is None and s.stats().misses == 1


def test_get_many_into_fills_each_slot_in_order(mooncake: LocalMooncake) -> None:
    pool = np.zeros((6, CHUNK_BYTES), dtype=np.uint8)  # more than one fetch window
    done: list[tuple[int, int | None]] = []
    with mc_store(mooncake.url) as s:
        for i in range(6):
            if i != 3:
                assert s.put(key(i), payload(CHUNK_BYTES, seed=i))
        items = [(key(i), memoryview(pool[i])) for i in range(6)]
        got = s.get_many_into(items, lambda i, n: done.append((i, n)))
        assert got == [CHUNK_BYTES] * 3 + [None] + [CHUNK_BYTES] * 2
        assert done == list(enumerate(got))
        for i in (0, 1, 2, 4, 5):
            assert pool[i].tobytes() == payload(CHUNK_BYTES, seed=i)
        assert (s.stats().gets, s.stats().hits, s.stats().misses) == (6, 5, 1)


def test_a_value_longer_than_the_slot_is_refused_as_corrupt(mooncake: LocalMooncake) -> None:
    with mc_store(mooncake.url) as s:
        assert s.put(key(1), payload(8192))
        assert s.get_into(key(1), bytearray(4096)) is None
        assert s.stats().corrupt == 1 and s.exists([key(1)]) == [False]


def test_exists_get_and_delete_agree(mooncake: LocalMooncake) -> None:
    with mc_store(mooncake.url) as s:
        assert s.put(key(1), b"one") and s.put(key(3), b"three")
        assert s.exists([key(1), key(2), key(3)]) == [True, False, True]
        assert s.exists([]) == []
        assert s.get(key(2)) is None
        assert s.get(key(1)) == b"one"  # a read leaves a lease; delete still removes it
        assert s.delete(key(1)) and not s.delete(key(1))
        assert s.exists([key(1), key(3)]) == [False, True]
        assert (s.stats().misses, s.stats().lookups, s.stats().errors) == (1, 5, 0)


def test_a_put_replaces_the_previous_value_entirely(mooncake: LocalMooncake) -> None:
    with mc_store(mooncake.url) as s:
        assert s.put(key(1), payload(CHUNK_BYTES, seed=1))
        assert s.get(key(1)) == payload(CHUNK_BYTES, seed=1)
        assert s.put(key(1), b"short")  # over a value just read (leased) too
        assert s.get(key(1)) == b"short"


def test_two_namespaces_never_see_each_others_values(mooncake: LocalMooncake) -> None:
    with mc_store(mooncake.url, NS_A) as a, mc_store(mooncake.url, NS_B) as b:
        data_a, data_b = payload(CHUNK_BYTES, seed=1), payload(CHUNK_BYTES, seed=2)
        assert a.put(key(1), data_a)
        assert b.exists([key(1)]) == [False] and b.get(key(1)) is None
        assert b.put(key(1), data_b)
        assert a.get(key(1)) == data_a and b.get(key(1)) == data_b
        assert a.delete(key(1))
        assert b.get(key(1)) == data_b
        assert a.stats().corrupt == b.stats().corrupt == 0


def _flip_a_byte(value: bytes) -> bytes:
    out = bytearray(value)
    out[HEADER_BYTES + 12345] ^= 0x40
    return bytes(out)


def _header_of_2_parts(value: bytes) -> bytes:
    header = bytearray(value[:HEADER_BYTES])
    header[52:56] = (2).to_bytes(4, "little")  # the parts field
    return bytes(header) + value[HEADER_BYTES:]


CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "flipped byte": _flip_a_byte,
    "truncated": lambda value: value[:-1000],
    "extra bytes": lambda value: value + b"x",
    "no header": lambda value: b"short",
    "garbage header": lambda value: b"\0" * HEADER_BYTES + value[HEADER_BYTES:],
    "wrong part count": _header_of_2_parts,
    "payload only": lambda value: value[HEADER_BYTES:],
}


@pytest.mark.parametrize("reader", ["get", "get_into"])
@pytest.mark.parametrize("corrupt", list(CORRUPTIONS), ids=str)
def test_a_corrupt_value_is_never_served_and_is_deleted(
    mooncake: LocalMooncake, corrupt: str, reader: str
) -> None:
    raw = raw_client(mooncake)
    with mc_store(mooncake.url) as s:
        data = payload(CHUNK_BYTES, seed=3)
        assert s.put(key(1), data) and s.put(key(2), data)
        name = s.store_key(key(1))
        assert raw.upsert(name, CORRUPTIONS[corrupt](raw.get(name))) == 0
        if reader == "get":
            assert s.get(key(1)) is None
        else:
            assert s.get_into(key(1), bytearray(CHUNK_BYTES + 1)) is None
        assert raw.is_exist(name) == 0  # deleted, so the next lookup misses
        assert s.stats().corrupt == 1
        assert s.get(key(1)) is None and s.stats().misses == 1
        assert s.get(key(2)) == data  # a neighbour is untouched
    raw.close()


def test_a_value_copied_into_another_namespace_or_key_is_refused(
    mooncake: LocalMooncake,
) -> None:
    raw = raw_client(mooncake)
    with mc_store(mooncake.url, NS_A) as a, mc_store(mooncake.url, NS_B) as b:
        assert a.put(key(1), payload(4096))
        value = raw.get(a.store_key(key(1)))
        assert raw.upsert(b.store_key(key(1)), value) == 0  # e.g. an operator's mistake
        assert raw.upsert(a.store_key(key(2)), value) == 0  # or another chunk's name
        assert b.get(key(1)) is None and a.get_into(key(2), bytearray(4096)) is None
        assert b.stats().corrupt == 1 and a.stats().corrupt == 1
        assert a.get(key(1)) == payload(4096)
    raw.close()


def test_the_store_opens_from_the_config(mooncake: LocalMooncake) -> None:
    cfg = MiniFlexConfig.from_dict({"remote_url": mooncake.url, "remote_timeout_s": "2"}, env={})
    with open_remote_store(cfg, NS_A) as s:  # type: ignore[union-attr]
        assert type(s).__name__ == "MooncakeStore"
        assert s.check()
        assert s.put(key(1), b"via config") and s.get(key(1)) == b"via config"
