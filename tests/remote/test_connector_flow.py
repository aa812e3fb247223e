"""The remote tier inside vLLM's real Scheduler, against a real redis-server.

Two engines of one model share a store: engine A computes a prompt (its
chunks reach the store by write-through), engine B, with empty local tiers,
loads it from the store bit for bit. Then the faults: a corrupted value, the
server killed and back, wrong credentials. The harness's stand-in model makes
every page a function of its prefix, so served bytes are checked exactly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from miniflex.errors import RemoteError
from miniflex.keys import chunk_key
from miniflex.remote.local_server import LocalServer
from miniflex.remote.uploader import RemoteUploader
from miniflex.tools.inspect_status import inspect_status
from tests.connector.engine_config import tokens as prompt_tokens
from tests.connector.harness import BLOCK, Harness, make_harness
from tests.connector.stats_sum import totals as summed_totals
from tests.handler_steps import wait_until
from tests.remote.conftest import NEEDS_SERVER

pytest.importorskip("redis", reason="the redis client is missing: pip install -e '.[remote]'")
pytestmark = NEEDS_SERVER

CHUNK = 2 * BLOCK
CHUNKS = 4
PROMPT = CHUNKS * CHUNK + 10


def tokens(seed: int) -> list[int]:
    return prompt_tokens(seed, PROMPT)


def engine(model: Path, url: str, **extra: object) -> Harness:
    """One engine with a CPU tier of 8 chunks and the store at ``url``."""
    return make_harness(
        model,
        cpu_bytes=str(8 * 4096),
        extra={"remote_url": url, "remote_timeout_s": 0.5, "remote_retry_s": 0.3, **extra},
    )


def totals(h: Harness) -> dict[str, float]:
    return summed_totals(h.kv_stats)


def computed(model: Path, url: str, seed: int, **extra: object) -> None:
    """Engine A computes ``tokens(seed)``; closing it puts what its write-through queued."""
    a = engine(model, url, **extra)
    a.cached_in_miniflex_only("a", tokens(seed))
    assert totals(a)["remote_puts"] == CHUNKS
    assert totals(a)["remote_put_bytes"] == CHUNKS * a.manager_side.manager.cost.chunk_bytes
    a.worker.shutdown()


def served(h: Harness, req_id: str, prompt: list[int]) -> int:
    """Serve ``prompt``; the tokens vLLM did not compute (loaded bytes checked exactly)."""
    return h.serve(req_id, prompt)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalServer]:
    with LocalServer(tmp_path / "server") as srv:
        yield srv


def test_a_second_engine_loads_what_the_first_computed(tmp_path: Path, server: LocalServer) -> None:
    computed(tmp_path / "model", server.url, seed=1)
    b = engine(tmp_path / "model", server.url, status_file=str(tmp_path / "status.json"))
    assert served(b, "b", tokens(1)) == CHUNKS * CHUNK
    t = totals(b)
    assert t["hit_tokens_remote"] == CHUNKS * CHUNK
    assert t["remote_fetched_chunks"] == CHUNKS and t.get("remote_read_failures", 0) == 0
    assert t["remote_fetch_bytes"] == CHUNKS * b.manager_side.manager.cost.chunk_bytes
    # now in B's CPU tier: the next request is a CPU hit, and nothing is put twice
    b.sched.reset_prefix_cache()
    assert served(b, "b2", tokens(1)) == CHUNKS * CHUNK
    assert totals(b)["hit_tokens_cpu"] == CHUNKS * CHUNK
    assert b.hits_by_source().get("external_unspecified", 0) >= CHUNKS * CHUNK
    status = b.manager_side.manager.status()
    assert status["remote"]["lookups"] > 0 and not status["remote"]["down"]
    b.shutdown()
    shown = inspect_status(tmp_path / "status.json")
    assert f"remote store {server.url}: up; shards 1" in shown


def test_another_model_reads_nothing(tmp_path: Path, server: LocalServer) -> None:
    computed(tmp_path / "model", server.url, seed=2)
    b = engine(tmp_path / "other-model", server.url)
    assert served(b, "b", tokens(2)) == 0
    b.worker.shutdown()


def test_a_corrupt_value_is_recomputed_and_deleted(tmp_path: Path, server: LocalServer) -> None:
    import redis

    computed(tmp_path / "model", server.url, seed=3)
    client = redis.Redis.from_url(server.url)
    names = sorted(client.keys("miniflex:*"))
    assert len(names) == CHUNKS
    victim = names[0]
    original = client.hget(victim, b"0")
    part = bytearray(original)
    part[100] ^= 0xFF
    client.hset(victim, b"0", bytes(part))
    b = engine(tmp_path / "model", server.url)
    got = served(b, "b", tokens(3))
    t = totals(b)
    assert t["remote_read_failures"] == 1
    assert got < CHUNKS * CHUNK  # vLLM recomputed from the corrupt chunk on
    b.shutdown()  # its write-through puts the recomputed chunk: the right bytes again
    assert client.hget(victim, b"0") == original


def test_a_killed_server_costs_at_most_a_timeout(tmp_path: Path, server: LocalServer) -> None:
    computed(tmp_path / "model", server.url, seed=4)
    b = engine(tmp_path / "model", server.url)
    server.kill()
    t0 = time.monotonic()
    assert served(b, "b", tokens(4)) == 0  # recomputed: nothing is reachable
    assert served(b, "b2", tokens(5)) == 0
    assert time.monotonic() - t0 < 5.0
    status = b.manager_side.manager.status()["remote"]
    assert status["down"] and status["errors"] >= 1
    server.start()
    time.sleep(0.4)  # the fast-fail window passes; the next lookup reconnects
    b.sched.reset_prefix_cache()
    served(b, "b3", tokens(6))
    assert b.manager_side.manager.status()["remote"]["reconnects"] >= 1
    b.worker.shutdown()


def test_wrong_credentials_are_refused_at_start_up(tmp_path: Path) -> None:
    with (
        LocalServer(tmp_path / "server", password="right") as srv,
        pytest.raises(RemoteError, match="remote_password"),
    ):
        engine(tmp_path / "model", srv.url, remote_password="wrong")


def test_an_unreachable_store_is_a_warning_and_the_engine_serves(tmp_path: Path) -> None:
    from miniflex.remote.local_server import free_port

    h = engine(tmp_path / "model", f"redis://127.0.0.1:{free_port()}")
    h.cached_in_miniflex_only("a", tokens(7))
    h.sched.reset_prefix_cache()
    assert served(h, "again", tokens(7)) == CHUNKS * CHUNK  # the CPU tier serves
    h.worker.shutdown()


def test_under_tp_a_hit_is_the_prefix_every_rank_holds(tmp_path: Path, server: LocalServer) -> None:
    import redis

    model = tmp_path / "model"
    a = make_harness(model, cpu_bytes=str(8 * 4096), extra={"remote_url": server.url}, tp_size=2)
    a.cached_in_miniflex_only("a", tokens(8))
    for r in a.ranks:
        r.worker.shutdown()
    client = redis.Redis.from_url(server.url)
    assert len(client.keys("miniflex:*")) == 2 * CHUNKS  # each rank's shard, apart
    b = make_harness(model, cpu_bytes=str(8 * 4096), extra={"remote_url": server.url}, tp_size=2)
    assert served(b, "b", tokens(8)) == CHUNKS * CHUNK
    # one rank's shard of the third chunk gone: only the first two load
    manager = b.manager_side.manager
    third = chunk_key(manager.ns, bytes(b.requests["b"].block_hashes[3 * 2 - 1]))
    client.delete(manager.remote.stores[1].redis_key(third))  # type: ignore[union-attr]
    c = make_harness(model, cpu_bytes=str(8 * 4096), extra={"remote_url": server.url}, tp_size=2)
    assert served(c, "c", tokens(8)) == 2 * CHUNK
    for h in (b, c):
        for r in h.ranks:
            r.worker.shutdown()


def test_write_through_behind_its_backlog_keeps_a_prefix(
    tmp_path: Path, server: LocalServer
) -> None:
    """A backlog of one chunk while the store is paused: the head is put, the rest dropped
    (counted), and the engine never waited for the store."""
    from miniflex.remote.uploader import RemoteUploader
    from tests.remote.conftest import key, store

    up = RemoteUploader(store(server.url, timeout_s=0.5), max_bytes=4096)
    server.pause()
    try:
        t0 = time.monotonic()
        offered = [up.offer(key(i), bytes([i]) * 4096) for i in range(4)]
        assert time.monotonic() - t0 < 0.2  # offers never wait for the store
    finally:
        server.resume()
    assert up.flush(10.0)
    s = up.stats()
    assert offered[0] and s.dropped >= 2 and s.put + s.failed + s.skipped == 4 - s.dropped
    up.close()
    assert up.store.get(key(0)) in (bytes([0]) * 4096, None)  # a timed-out put may fail


def test_write_back_puts_what_the_cpu_tier_evicts(tmp_path: Path, server: LocalServer) -> None:
    """remote_write=back: the CPU tier (8 chunks) evicts the first of three 4-chunk
    prompts; only those chunks reach the store, and another engine loads them from it."""
    import redis

    model = tmp_path / "model"
    a = engine(model, server.url, remote_write="back")
    for seed in (10, 11, 12):
        a.cached_in_miniflex_only(f"a{seed}", tokens(seed))
    assert totals(a)["remote_puts"] >= CHUNKS
    a.shutdown()  # puts what is queued
    assert 0 < len(redis.Redis.from_url(server.url).keys("miniflex:*")) < 3 * CHUNKS
    b = engine(model, server.url)
    assert served(b, "b", tokens(10)) == CHUNKS * CHUNK  # evicted by A: in the store
    assert served(b, "b2", tokens(12)) == 0  # still in A's CPU tier only
    b.shutdown()


def uploader(h: Harness) -> RemoteUploader:
    remote = h.worker.step.handler._remote
    assert remote is not None and remote.uploader is not None
    return remote.uploader


def test_what_the_puts_came_to_reaches_the_schedulers_counters(
    tmp_path: Path, server: LocalServer
) -> None:
    """The workers report each put's outcome: two prompts' chunks acknowledged by the store,
    counted once each (a later step carries a report made after the puts ended)."""
    a = engine(tmp_path / "model", server.url)
    for seed in (1, 2):
        a.cached_in_miniflex_only(f"p{seed}", tokens(seed))
        assert uploader(a).flush(10)
    assert served(a, "again", tokens(1)) > 0  # a CPU hit: its steps put nothing new
    t = totals(a)
    assert t["remote_puts"] == t["remote_puts_acked"] == 2 * CHUNKS
    assert t["remote_puts_failed"] == t["remote_puts_dropped"] == t["remote_puts_held"] == 0
    a.worker.shutdown()


def test_puts_dropped_behind_a_full_backlog_are_counted(
    tmp_path: Path, server: LocalServer
) -> None:
    """A backlog of one chunk while the store is paused: the other three are dropped unsent,
    and the scheduler's counters say so; every chunk handed over is accounted for."""
    a = engine(tmp_path / "model", server.url, remote_write_backlog="4KiB")
    server.pause()
    try:
        a.cached_in_miniflex_only("p", tokens(3))
        wait_until(lambda: uploader(a).stats().offered == CHUNKS, "the copies")
    finally:
        server.resume()
    assert uploader(a).flush(10)
    served(a, "again", tokens(3))
    t = totals(a)
    assert t["remote_puts_dropped"] == CHUNKS - 1
    ended = t["remote_puts_acked"] + t["remote_puts_failed"] + t["remote_puts_dropped"]
    assert ended == t["remote_puts"] == CHUNKS
    a.worker.shutdown()
