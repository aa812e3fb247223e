"""A remote hit longer than the CPU tier, inside vLLM's real Scheduler, against redis-server.

Engine A computes a 9-chunk prompt; its write-through puts every chunk. Engine B, with
a CPU tier of 4 chunks and empty local tiers, fetches the first 4 into CPU slots and
streams the other 5 through its staging slots, a window at a time. The harness's
stand-in model makes every page a function of its prefix, so served bytes are checked
exactly.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from miniflex.keys import chunk_key
from miniflex.remote.local_server import LocalServer
from tests.connector.engine_config import tokens as prompt_tokens
from tests.connector.harness import BLOCK, Harness, make_harness
from tests.connector.stats_sum import totals as summed_totals
from tests.remote.conftest import NEEDS_SERVER

pytest.importorskip("redis", reason="the redis client is missing: pip install -e '.[remote]'")
pytestmark = NEEDS_SERVER

SLOT = 4096  # the harness's chunk: 2 layers x 2 blocks x 1 KiB pages
CHUNK = 2 * BLOCK
LONG = 9
CPU_SLOTS = 4
PROMPT = LONG * CHUNK + 10


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalServer]:
    with LocalServer(tmp_path / "server") as srv:
        yield srv


def engine(model: Path, url: str, cpu_slots: int, **extra: object) -> Harness:
    return make_harness(
        model,
        cpu_bytes=str(cpu_slots * SLOT),
        extra={"remote_url": url, "remote_timeout_s": 0.5, "remote_retry_s": 0.3, **extra},
    )


def computed(model: Path, url: str, puts: int = LONG) -> tuple[list[int], list[bytes]]:
    """Engine A (a CPU tier that holds the prompt) computes it and puts the ``puts`` chunks
    the store lacks; returns the prompt and its block hashes."""
    prompt = prompt_tokens(1, PROMPT)
    a = engine(model, url, 2 * LONG)
    a.cached_in_miniflex_only("a", prompt)
    hashes = [bytes(h) for h in a.requests["a"].block_hashes]
    a.shutdown()
    assert summed_totals(a.kv_stats)["remote_puts"] == puts
    return prompt, hashes


def nothing_held(h: Harness) -> bool:
    """No CPU slot pinned, no staging slot held."""
    manager = h.manager_side.manager
    ring = h.worker.handler._reads.streamer._ring
    return manager.cpu.usage().pinned_or_moving == 0 and ring.idle()


@pytest.mark.parametrize("staging_slots", [2, 3])
def test_a_remote_hit_longer_than_the_cpu_tier_streams_through_the_staging_slots(
    tmp_path: Path, server: LocalServer, staging_slots: int
) -> None:
    """Every byte of the 9 chunks is the model's own; 4 land in CPU slots (published there,
    so the next request is a CPU hit for them) and 5 stream, never entering the CPU tier,
    nor stored into it after the load."""
    prompt, _ = computed(tmp_path / "model", server.url)
    b = engine(
        tmp_path / "model", server.url, CPU_SLOTS, ssd_stream_bytes=str(staging_slots * SLOT)
    )
    assert b.serve("b", prompt) == LONG * CHUNK
    t = summed_totals(b.kv_stats)
    assert t["hit_tokens_remote"] == LONG * CHUNK
    assert (t["remote_fetched_chunks"], t["remote_streamed_chunks"]) == (CPU_SLOTS, LONG - 4)
    assert t["remote_fetch_bytes"] == LONG * SLOT
    assert t.get("remote_read_failures", 0) == 0 and t.get("streamed_chunks", 0) == 0
    assert nothing_held(b)
    assert b.sched.reset_prefix_cache()
    assert b.serve("again", prompt) == LONG * CHUNK
    again = summed_totals(b.kv_stats)
    assert again["hit_tokens_cpu"] == CPU_SLOTS * CHUNK  # the chunks fetched into CPU slots
    assert again["hit_tokens_remote"] - t["hit_tokens_remote"] == (LONG - CPU_SLOTS) * CHUNK
    # what came from the store is not stored (nor put) again: it would push the head out
    assert again.get("stored_tokens", 0) == 0 and again.get("remote_puts", 0) == 0
    b.shutdown()


def test_without_staging_a_remote_hit_is_promised_only_as_far_as_the_cpu_tier_holds_it(
    tmp_path: Path, server: LocalServer
) -> None:
    """``ssd_stream_bytes=0``: every fetch lands in a CPU slot, so vLLM is promised the 4
    chunks the tier holds and recomputes the rest."""
    prompt, _ = computed(tmp_path / "model", server.url)
    b = engine(tmp_path / "model", server.url, CPU_SLOTS, ssd_stream_bytes="0")
    assert b.serve("b", prompt) == CPU_SLOTS * CHUNK
    assert b.cached_tokens["b"] == CPU_SLOTS * CHUNK
    assert nothing_held(b)
    b.shutdown()


def test_a_corrupt_streamed_value_costs_a_recompute_from_it(
    tmp_path: Path, server: LocalServer
) -> None:
    """Chunk 6 (streamed) fails its checksum: the load serves the 6 chunks before it, the
    store deletes the bad value (the recompute puts it again), and every slot is given
    back. The chunks after it arrive all the same, but vLLM recomputes from the first
    failed block on."""
    import redis

    prompt, hashes = computed(tmp_path / "model", server.url)
    b = engine(tmp_path / "model", server.url, CPU_SLOTS, ssd_stream_bytes=str(2 * SLOT))
    manager = b.manager_side.manager
    client = redis.Redis.from_url(server.url)
    bad = 6
    key = chunk_key(manager.ns, hashes[(bad + 1) * CHUNK // BLOCK - 1])
    name = manager.remote.stores[0].redis_key(key)  # type: ignore[union-attr]
    original = client.hget(name, b"0")
    value = bytearray(original)
    value[100] ^= 0xFF
    client.hset(name, b"0", bytes(value))
    assert b.serve("b", prompt) == bad * CHUNK
    t = summed_totals(b.kv_stats)
    assert t["remote_read_failures"] == 1
    assert t["remote_streamed_chunks"] == LONG - CPU_SLOTS - 1  # every other one arrived
    assert nothing_held(b)
    b.shutdown()  # its write-through puts the recomputed chunk: the right bytes again
    assert client.hget(name, b"0") == original


def test_a_load_from_the_store_alone_streams_on_the_fetch_lane(
    tmp_path: Path, server: LocalServer
) -> None:
    """No SSD tier: the windows are fetched on the remote-fetch lane's thread, so such a
    load never queues behind another request's disk reads."""
    from miniflex.worker import load_reads

    prompt, _ = computed(tmp_path / "model", server.url)
    b = engine(tmp_path / "model", server.url, CPU_SLOTS, ssd_stream_bytes=str(2 * SLOT))
    threads: list[str] = []
    window = load_reads.Streamer._window

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread().name)
        return window(self, *args, **kwargs)

    load_reads.Streamer._window = spy  # type: ignore[method-assign]
    try:
        assert b.serve("b", prompt) == LONG * CHUNK
    finally:
        load_reads.Streamer._window = window  # type: ignore[method-assign]
    assert threads and set(threads) == {"miniflex-remote-fetch"}
    b.shutdown()


def test_a_load_from_ssd_then_the_store_streams_both(tmp_path: Path, server: LocalServer) -> None:
    """Engine B computes the first 6 chunks of a prompt, which its 5-slot CPU tier (2 of
    them kept for write-back) pushes onto SSD; engine A then computes the whole prompt
    (loading those 6 from the store) and puts the last 3. B's load of the prompt promotes
    3 SSD chunks, streams the other 3, then streams the 3 remote ones after them through
    the same staging slots, all on the ssd-read lane; every byte is the model's own."""
    head = prompt_tokens(1, PROMPT)[: 6 * CHUNK + 10]
    (tmp_path / "ssd").mkdir()
    b = make_harness(
        tmp_path / "model",
        cpu_bytes=str(5 * SLOT),
        max_batched=2 * CHUNK,  # write-back keeps up: every chunk evicted is written
        extra={
            "remote_url": server.url,
            "ssd_dirs": str(tmp_path / "ssd"),
            "ssd_bytes": str(64 * SLOT),
            "ssd_write_backlog": str(2 * SLOT),
            "ssd_stream_bytes": str(2 * SLOT),
            "hit_policy": "load",
        },
    )
    b.cached_in_miniflex_only("head", head)
    for seed in (2, 3):  # push the head out of the CPU tier, onto SSD
        b.cached_in_miniflex_only(f"w{seed}", prompt_tokens(seed, 6 * CHUNK + 10))
    handler = b.worker.handler
    handler.drain()  # the put copies are made; then the puts themselves go out
    assert handler._remote is not None and handler._remote.uploader is not None
    assert handler._remote.uploader.flush(10.0)
    prompt, _ = computed(tmp_path / "model", server.url, puts=LONG - 6)
    assert b.sched.reset_prefix_cache()
    before = summed_totals(b.kv_stats)
    assert b.serve("b", prompt, steps=5) == LONG * CHUNK
    after = summed_totals(b.kv_stats)
    t = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert (t["hit_tokens_ssd"], t["hit_tokens_remote"]) == (6 * CHUNK, 3 * CHUNK)
    assert (t["promoted_chunks"], t["streamed_chunks"]) == (3, 3)
    assert (t["remote_fetched_chunks"], t["remote_streamed_chunks"]) == (0, 3)
    assert t["remote_read_failures"] == 0 and t["ssd_read_failures"] == 0
    assert nothing_held(b)
    b.shutdown()


def test_write_through_of_a_step_larger_than_the_cpu_tier_puts_every_chunk(
    tmp_path: Path, server: LocalServer
) -> None:
    """Engine A, with a CPU tier of 4 chunks and no SSD, computes the 9-chunk prompt in one
    step: the chunks that find every slot pinned (by the stores and put copies before them)
    wait for one instead of being dropped, so all 9 reach the store and another engine
    loads the whole prompt from it."""
    import redis

    prompt = prompt_tokens(1, PROMPT)
    a = make_harness(
        tmp_path / "model",
        num_blocks=96,
        cpu_bytes=str(CPU_SLOTS * SLOT),
        max_batched=(LONG + 1) * CHUNK,  # the whole prompt in one step
        extra={"remote_url": server.url, "hit_policy": "load"},
    )
    a.add("a", prompt, max_tokens=2)
    a.run()
    a.shutdown()
    t = summed_totals(a.kv_stats)
    assert t.get("stores_skipped", 0) == 0 and t["remote_puts"] == LONG
    assert len(redis.Redis.from_url(server.url).keys("miniflex:*")) == LONG
    b = engine(tmp_path / "model", server.url, CPU_SLOTS, ssd_stream_bytes=str(2 * SLOT))
    assert b.serve("b", prompt) == LONG * CHUNK
    b.shutdown()
