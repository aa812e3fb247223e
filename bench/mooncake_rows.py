"""MiniFlex's own Mooncake backend, read as the remote tier reads it, for ``bench.mooncake_wire``.

A load's fetch is :class:`~miniflex.remote.fetch.RemoteFetcher` over
:class:`~miniflex.remote.mooncake_store.MooncakeStore`: each stream one ``get_many_into``,
which is one ``batch_get_into`` per window of at most 32 MiB into the store's staging
buffers, then each value's header and CRC checked and its payload copied into the slot.
The chunks are put through the same class (MiniFlex's envelope, its key names), by the
holder process, so that they sit in the holder's segment as the raw rows' values do::

    stage(url, data, count)                  # in the holder, before the reader starts
    store = open_store(url)                  # in the reader: set up, as the tier's check()
    fetch_gbps(store, pool, count, streams)  # untimed once first: the staging buffers
    store.close()
"""

from __future__ import annotations

from miniflex.plan import RemoteCopy
from miniflex.pool import HostPool
from miniflex.remote.fetch import RemoteFetcher
from miniflex.remote.mooncake_store import MooncakeStore
from miniflex.types import ChunkKey, SlotId

__all__ = ["NS", "fetch_gbps", "mooncake_url", "open_store", "stage"]

NS = b"mooncake-wire-ns"
"""The namespace digest of the staged chunks (16 bytes)."""
TIMEOUT_S = 10.0
"""Per call (one put, or one window): generous, as ``bench.remote_wire``'s Redis stores', so
that a busy 2-core host measures slow fetches rather than failed ones."""


def mooncake_url(master: int, metadata: int) -> str:
    """The ``mooncake://`` URL of a master on this host with its HTTP metadata server."""
    meta = f"http://127.0.0.1:{metadata}/metadata"
    return f"mooncake://127.0.0.1:{master}?metadata={meta}&protocol=tcp"


def open_store(url: str) -> MooncakeStore:
    """A set-up store (its client set up by the start-up probe, as the tier's is)."""
    store = MooncakeStore(url, NS, timeout_s=TIMEOUT_S)
    if not store.check():
        store.close()
        raise RuntimeError(f"MiniFlex's Mooncake store {url} did not answer its probe")
    return store


def stage(url: str, data: bytes, count: int) -> None:
    """Put ``count`` copies of ``data`` as chunks ``1..count`` (MiniFlex's envelope)."""
    store = open_store(url)
    try:
        for i in range(count):
            if not store.put(ChunkKey(i + 1), data):
                raise RuntimeError(f"MiniFlex's put of chunk {i + 1} failed: {store.stats()}")
    finally:
        store.close()


def fetch_gbps(store: MooncakeStore, pool: HostPool, count: int, streams: int) -> float:
    """A load's fetch of chunks ``1..count`` into slots ``0..count-1`` over ``streams``."""
    copies = [RemoteCopy(ChunkKey(i + 1), SlotId(i)) for i in range(count)]
    fetcher = RemoteFetcher(store, pool, streams)
    try:
        failed, seconds = fetcher.fetch(copies)
    finally:
        fetcher.close()
    if failed:
        raise RuntimeError(f"{len(failed)} of {count} fetches failed: {store.stats()}")
    return pool.slot_bytes * count / seconds / 1e9
