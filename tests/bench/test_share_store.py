"""The store of ``bench.remote_share``: option checks, a Mooncake segment's size, the wait for
write-through, and a private Mooncake Store counted as the benchmark counts it."""

from __future__ import annotations

import argparse
import tempfile

import pytest

from bench.share_store import (
    MIN_SEGMENT_BYTES,
    MOONCAKE,
    SharedStore,
    given_store,
    private_share_store,
    segment_bytes,
    server_args_error,
    store_tokens,
    wait_for_puts,
)
from miniflex.remote.local_mooncake import mooncake_missing

MIB = 1 << 20


def _args(**given: object) -> argparse.Namespace:
    base = {
        "url": None,
        "server": None,
        "server_memory": None,
        "server_io_threads": 1,
        "server_cluster": 0,
    }
    return argparse.Namespace(**(base | given))


def test_a_private_store_of_any_kind_takes_its_options() -> None:
    assert server_args_error(_args()) is None
    assert server_args_error(_args(server="valkey-server", server_cluster=3)) is None
    assert server_args_error(_args(server=MOONCAKE, server_memory="2GiB")) is None


def test_options_of_a_private_store_are_refused_with_a_url() -> None:
    for given in (
        {"server": MOONCAKE},
        {"server_memory": "8gb"},
        {"server_io_threads": 4},
        {"server_cluster": 3},
    ):
        error = server_args_error(_args(url="redis://127.0.0.1:6379", **given))
        assert error is not None and "not with --url" in error, given


def test_a_mooncake_store_has_no_cluster_and_no_io_threads() -> None:
    for given in ({"server_cluster": 3}, {"server_io_threads": 2}):
        error = server_args_error(_args(server=MOONCAKE, **given))
        assert error is not None and "mooncake" in error, given


def test_a_bad_memory_size_is_named() -> None:
    error = server_args_error(_args(server=MOONCAKE, server_memory="lots"))
    assert error is not None and "'lots'" in error


def test_the_tokens_written_count_each_engine_b() -> None:
    # A: warm-up and the prompt; B: its warm-up, calibration and a fresh prompt.
    assert store_tokens([2048], 1, 1, warm=256, calibration=7168) == 11_776
    # two lengths, three repeats, two engines B
    prompts = 3 * (1024 + 4096)
    expected = 256 + prompts + 2 * (256 + 100 + prompts)
    assert store_tokens([1024, 4096], 3, 2, warm=256, calibration=100) == expected


def test_a_small_run_gets_the_smallest_segment() -> None:
    assert segment_bytes(0, 8192) == MIN_SEGMENT_BYTES
    assert segment_bytes(11_776, 8192) == MIN_SEGMENT_BYTES  # 115 MiB with the slack


def test_a_large_run_gets_its_kv_with_slack_in_whole_mib() -> None:
    assert segment_bytes(40_000, 128 << 10) == 6250 * MIB  # 4.9 GiB of KV
    size = segment_bytes(300_001, 8192)
    assert size % MIB == 0
    assert 300_001 * 8192 * 1.25 <= size < 300_001 * 8192 * 1.25 + MIB


def test_a_redis_url_is_counted_and_a_mooncake_url_is_not() -> None:
    assert given_store("redis://127.0.0.1:6379").count_keys is not None
    mooncake = given_store("mooncake://127.0.0.1:50051?protocol=tcp")
    assert mooncake.count_keys is None
    assert wait_for_puts(mooncake) is None


def test_the_wait_ends_once_the_count_stops_growing() -> None:
    counts = iter([1, 5, 9, 9, 9, 9, 9, 9, 9, 9])
    store = SharedStore("redis://unused", lambda: next(counts))
    assert wait_for_puts(store, quiet_s=0.5, limit_s=30) == 9


def test_the_wait_gives_up_at_its_limit() -> None:
    counts = iter(range(1000))
    store = SharedStore("redis://unused", lambda: next(counts))
    assert wait_for_puts(store, quiet_s=5, limit_s=0.6) in range(1, 5)


@pytest.mark.skipif(mooncake_missing() is not None, reason=mooncake_missing() or "")
def test_a_private_mooncake_store_counts_what_is_put() -> None:
    from mooncake.store import MooncakeDistributedStore

    args = _args(server=MOONCAKE)
    with (
        tempfile.TemporaryDirectory() as tmp,
        private_share_store(tmp, args, tokens=1000, kv_bytes_per_token=8192) as store,
    ):
        assert store.url.startswith("mooncake://") and store.count_keys is not None
        assert store.count_keys() == 0
        master, rest = store.url.removeprefix("mooncake://").split("?", 1)
        metadata = rest.split("metadata=", 1)[1].split("&", 1)[0]
        client = MooncakeDistributedStore()
        assert client.setup("127.0.0.1", metadata, 0, 16 << 20, "tcp", "", master) == 0
        for i in range(3):
            assert client.put(f"k{i}", b"x" * 1000) == 0
        assert store.count_keys() == 3
        client.close()
