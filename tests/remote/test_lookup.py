"""RemoteLookup.ask against real servers: two namespaces stand for two TP shards."""

from __future__ import annotations

import pytest

pytest.importorskip("redis", reason="the redis client is missing: pip install -e '.[remote]'")

from miniflex.remote.local_server import LocalServer
from miniflex.remote.lookup import RemoteLookup
from tests.remote.conftest import NEEDS_SERVER, NS_A, NS_B, key, store

pytestmark = NEEDS_SERVER

KEYS = [key(i) for i in range(6)]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def put(url: str, ns: bytes, count: int) -> None:
    s = store(url, ns)
    assert all(s.put(k, b"x" * 64) for k in KEYS[:count])
    s.close()


def test_a_chunk_counts_only_where_every_shard_holds_it(server: LocalServer) -> None:
    put(server.url, NS_A, 5)
    put(server.url, NS_B, 3)  # shard B lacks chunks 3 and 4
    lookup = RemoteLookup([store(server.url, NS_A), store(server.url, NS_B)], clock=Clock())
    assert lookup.ask(KEYS).held == 3
    assert lookup.ask(KEYS[3:]).held == 0  # a run that starts at a gap holds nothing
    assert lookup.ask([]).held == 0
    lookup.close()


def test_a_fresh_answer_is_reused_and_a_stale_or_different_one_asks_again(
    server: LocalServer,
) -> None:
    clock = Clock()
    put(server.url, NS_A, 2)
    lookup = RemoteLookup([store(server.url, NS_A)], ttl_s=1.0, clock=clock)
    first = lookup.ask(KEYS[:4])
    assert first.held == 2
    put(server.url, NS_A, 4)  # the store gains chunks 2 and 3
    assert lookup.ask(KEYS[:4], first) is first  # fresh, same keys: not asked
    assert lookup.ask(KEYS[:3], first).held == 3  # other keys: asked
    clock.now += 1.0
    assert lookup.ask(KEYS[:4], first).held == 4  # stale: asked
    assert lookup.ask(KEYS[:4], None).held == 4  # none kept (a failed fetch dropped it)
    lookup.close()


def test_a_store_that_cannot_answer_holds_nothing(server: LocalServer) -> None:
    put(server.url, NS_A, 3)
    lookup = RemoteLookup([store(server.url, NS_A, timeout_s=0.5)], clock=Clock())
    server.kill()
    assert lookup.ask(KEYS).held == 0
    lookup.close()


def test_held_each_answers_every_key_past_a_gap_on_every_shard(server: LocalServer) -> None:
    a, b = store(server.url, NS_A), store(server.url, NS_B)
    for i in (0, 2, 3, 5):
        assert a.put(KEYS[i], b"x" * 64)
    for i in (2, 5):
        assert b.put(KEYS[i], b"x" * 64)
    one = RemoteLookup([store(server.url, NS_A)])
    assert one.held_each(KEYS) == [True, False, True, True, False, True]
    both = RemoteLookup([store(server.url, NS_A), store(server.url, NS_B)])
    assert both.held_each(KEYS) == [False, False, True, False, False, True]
    assert both.held_each([]) == []
    for lookup in (one, both):
        lookup.close()
    a.close()
    b.close()
