"""The store that ``bench.remote_share``'s engines share: the ``--url`` given, or a private one.

A private store is a ``redis-server`` or ``valkey-server`` (one, or a cluster of
``--server-cluster`` primaries, each with ``--server-memory``, 8gb unless given), or, with
``--server mooncake``, a Mooncake Store: a master and one holder
(:class:`~miniflex.remote.local_mooncake.LocalMooncake`) whose segment is ``--server-memory``
or else sized to hold every chunk the run writes (:func:`segment_bytes`), so that Mooncake
evicts nothing engine A put before engine B reads it::

    with private_share_store(tmp, args, tokens, kv_bytes_per_token) as store:
        ...                                   # engine A on store.url
        wait_for_puts(store)                  # until its key count stops growing
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

from miniflex.config import parse_size
from miniflex.errors import ConfigError
from miniflex.remote.local_mooncake import LocalMooncake
from miniflex.remote.local_server import SERVER_BINARIES, private_store

__all__ = [
    "MOONCAKE",
    "SERVERS",
    "SharedStore",
    "given_store",
    "private_share_store",
    "segment_bytes",
    "server_args_error",
    "store_tokens",
    "wait_for_puts",
]

MOONCAKE = "mooncake"
SERVERS = (*SERVER_BINARIES, MOONCAKE)
"""What ``--server`` accepts."""
REDIS_MEMORY = "8gb"
"""A private Redis's maxmemory (per primary) unless ``--server-memory`` is given."""
SEGMENT_SLACK = 1.25
"""Segment bytes per byte of KV written: room for the 64-byte headers, the allocator's
rounding and Mooncake's eviction, which starts at 95% full."""
MIN_SEGMENT_BYTES = 256 << 20
_MIB = 1 << 20


@dataclass(frozen=True)
class SharedStore:
    """Where the engines meet, and how to count what it holds."""

    url: str
    count_keys: Callable[[], int] | None
    """The number of keys the store holds now; None where it cannot be asked (a Mooncake
    Store not started here: its master's metrics port is not in its URL)."""
    about: str = "the store at --url"
    """What it is, for the log and the results."""
    open_counter: Callable[[], AbstractContextManager[Callable[[], int]]] | None = None
    """Opens one connection for a run of counts (:func:`wait_for_puts`'s), closed when the
    block ends, and yields its key count; None: each ``count_keys()`` stands alone."""


def server_args_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the store options together, or None."""
    private = ("--server", "--server-memory", "--server-io-threads", "--server-cluster")
    if args.url and (
        args.server or args.server_memory or args.server_io_threads > 1 or args.server_cluster
    ):
        return f"{', '.join(private)} start a private store: not with --url"
    if args.server == MOONCAKE and (args.server_cluster or args.server_io_threads > 1):
        return "--server mooncake is one master and one holder: no --server-cluster or threads"
    if args.server_memory is not None:
        try:
            parse_size("--server-memory", args.server_memory)
        except ConfigError as exc:
            return str(exc)
    return None


def segment_bytes(tokens: int, kv_bytes_per_token: int) -> int:
    """The holder's segment for ``tokens`` tokens' KV written: with :data:`SEGMENT_SLACK`,
    in whole MiB, at least :data:`MIN_SEGMENT_BYTES`. E.g. 11,776 tokens of the demo
    model (8 KiB a token): 92 MiB of KV, 115 MiB with the slack, so 256 MiB; 40,000 tokens
    of an 8B model (128 KiB a token): 4.9 GiB of KV, 6250 MiB."""
    assert tokens >= 0 and kv_bytes_per_token >= 0, (tokens, kv_bytes_per_token)
    need = -(-int(tokens * kv_bytes_per_token * SEGMENT_SLACK) // _MIB) * _MIB
    return max(MIN_SEGMENT_BYTES, need)


def store_tokens(
    lengths: Sequence[int], repeat: int, engines_b: int, warm: int, calibration: int
) -> int:
    """Tokens whose KV a run writes to the store, at most: engine A's warm-up (``warm``
    tokens) and ``repeat`` prompts of each length, and each engine B's warm-up, its
    ``calibration`` tokens and as many fresh prompts (A's prompts, which B reads, are not
    written again). E.g. one 2048-token prompt, one engine B, 256-token warm-ups and 7168
    tokens of calibration: 256 + 2048 + (256 + 7168 + 2048) = 11,776."""
    prompts = repeat * sum(lengths)
    return warm + prompts + engines_b * (warm + calibration + prompts)


def given_store(url: str) -> SharedStore:
    """The store at ``url`` (``--url``)."""
    if url.startswith(f"{MOONCAKE}://"):
        return SharedStore(url, None)
    return SharedStore(url, lambda: _redis_keys(url), open_counter=lambda: _redis_counter(url))


@contextmanager
def private_share_store(
    tmp: str, args: argparse.Namespace, tokens: int, kv_bytes_per_token: int
) -> Iterator[SharedStore]:
    """A private store in ``tmp`` as ``args`` ask (see the module docstring), killed at exit.

    ``tokens``: the tokens whose KV the run writes, at most (sizes a Mooncake segment)."""
    if args.server == MOONCAKE:
        if args.server_memory is None:
            segment = segment_bytes(tokens, kv_bytes_per_token)
        else:
            segment = parse_size("--server-memory", args.server_memory)
        about = f"a private Mooncake Store: a master and one holder of {segment >> 20} MiB"
        with LocalMooncake(os.path.join(tmp, "mooncake"), segment) as server:
            yield SharedStore(server.url, server.key_count, about)
        return
    options = {  # a cluster's memory is per primary
        "maxmemory": args.server_memory or REDIS_MEMORY,
        "io_threads": args.server_io_threads,
        "binary": args.server,
    }
    shape = f"a cluster of {args.server_cluster} primaries" if args.server_cluster else "one"
    about = f"a private {args.server or 'redis-server'}, {shape}, maxmemory {options['maxmemory']}"
    with private_store(tmp, args.server_cluster, **options) as srv:
        yield SharedStore(
            srv.url,
            lambda: _redis_keys(srv.url),
            about,
            open_counter=lambda: _redis_counter(srv.url),
        )


def wait_for_puts(store: SharedStore, quiet_s: float = 2.0, limit_s: float = 600.0) -> int | None:
    """Until the store's key count stops growing for ``quiet_s``: write-through is done (on
    a cluster, the keys of all its primaries). The last count; None if it cannot be counted
    (then engine A's shutdown, which puts what is queued first, is all there is).

    The counts of one wait share one connection where the store can open one
    (:attr:`SharedStore.open_counter`)."""
    if store.count_keys is None:
        return None
    counter = store.open_counter() if store.open_counter else nullcontext(store.count_keys)
    with counter as count_keys:
        last, since, deadline = -1, time.monotonic(), time.monotonic() + limit_s
        while time.monotonic() < deadline:
            n = count_keys()
            if n != last:
                last, since = n, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                break
            time.sleep(0.25)
    return last


@contextmanager
def _redis_counter(url: str) -> Iterator[Callable[[], int]]:
    """One client of the store at ``url`` for the block, closed at its end: yields its key
    count (on a cluster, of all its primaries)."""
    from miniflex.remote.redis_clients import LazyCluster, open_client

    password = os.environ.get("MINIFLEX_REMOTE_PASSWORD") or None
    client = open_client(url, tls=False, options={"password": password})
    try:
        where = {"target_nodes": "primaries"} if isinstance(client, LazyCluster) else {}
        yield lambda: int(client.dbsize(**where))
    finally:
        client.close()


def _redis_keys(url: str) -> int:
    """The key count of the store at ``url``, on a client of its own."""
    with _redis_counter(url) as count:
        return count()
