"""Wiring of the remote tier (``remote_url``) into the connector's two halves.

* **Start-up.** Each process opens its stores and runs ``check()`` first, before
  anything slow is built: credentials the store refuses raise ``RemoteError``
  (one line naming the config keys), a store that cannot be reached is a
  warning, and MiniFlex serves from its local tiers until it answers (every
  call after that reconnects by itself, see :mod:`miniflex.remote.link`).
* **Scheduler.** A :class:`~miniflex.remote.lookup.RemoteLookup` over every
  shard's namespace: a lookup extends the local run with the chunks every
  shard's store holds.
* **Worker.** :class:`WorkerRemote`: this rank's store, the fetcher a load's
  reads use, the write-through uploader, and the start-up fetch probe.

Example::

    lookup = open_lookup(config, ns, placement)        # scheduler; None without remote_url
    side = WorkerRemote.open(config, ns.shard(rank).digest)   # worker (ranks that write)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

from miniflex.config import MiniFlexConfig
from miniflex.keys import Namespace
from miniflex.plan import JobResult, PutOutcome, RemoteCopy, TransferJob
from miniflex.pool import HostPool
from miniflex.ranks import TPPlacement
from miniflex.remote import RemoteStore, open_remote_store
from miniflex.remote.fetch import RemoteFetcher, auto_fetch_streams
from miniflex.remote.lookup import RemoteLookup
from miniflex.remote.probe import probe_fetch_bandwidth
from miniflex.remote.uploader import COPY_THREADS, RemoteUploader

__all__ = ["PUT_GROUP", "WorkerRemote", "check_store", "open_checked", "open_lookup", "put_groups"]

logger = logging.getLogger("miniflex.remote")

PUT_GROUP = 16
"""Chunks of a job copied for their puts per hand-off: the slots of each group may be
overwritten as soon as that group is copied, not once the whole job is (a step of a long
prompt stores thousands of chunks; a load into one of its slots waited for all of them)."""


def put_groups(puts: Sequence[RemoteCopy]) -> list[tuple[RemoteCopy, ...]]:
    """A job's puts in hand-offs of :data:`PUT_GROUP` chunks, in order."""
    return [tuple(puts[i : i + PUT_GROUP]) for i in range(0, len(puts), PUT_GROUP)]


def open_checked(config: MiniFlexConfig, namespace_digest: bytes) -> RemoteStore | None:
    """The store of ``remote_url`` for one namespace, checked (None without ``remote_url``).

    Raises RemoteError for a store that refuses MiniFlex (credentials, ACL,
    TLS, a read-only replica); a store that cannot be reached is logged once
    and returned all the same: its calls fail fast until it answers.
    """
    store = open_remote_store(config, namespace_digest)
    if store is None:
        return None
    try:
        reachable = store.check()
    except BaseException:
        store.close()
        raise
    if not reachable:
        logger.warning(
            "MiniFlex: remote store %s cannot be reached (remote_timeout_s=%s): serving from "
            "the local tiers, trying again every remote_retry_s=%s",
            store.url,
            config.remote_timeout_s,
            config.remote_retry_s,
        )
    return store


def check_store(config: MiniFlexConfig) -> str:
    """Before vLLM starts (``miniflex serve``, ``make_llm``): RemoteError for a store that
    refuses MiniFlex, else one line saying whether it answered. The probe is written under a
    namespace of zeros: credentials and ACLs depend on the key prefix, not the namespace."""
    store = open_checked(config, bytes(16))
    assert store is not None, "remote_url is set"
    try:
        up = not store.stats().down
    finally:
        store.close()
    state = "answers" if up else "cannot be reached now: the local tiers serve until it answers"
    return f"remote store {store.url}: {state}"


def open_lookup(
    config: MiniFlexConfig, ns: Namespace, placement: TPPlacement
) -> RemoteLookup | None:
    """The scheduler's lookup over every shard's namespace (None without ``remote_url``)."""
    stores: list[RemoteStore] = []
    try:
        for rank in placement.store_ranks():
            store = open_checked(config, ns.shard(rank).digest)
            if store is None:
                return None
            stores.append(store)
    except BaseException:
        for store in stores:
            store.close()
        raise
    return RemoteLookup(stores)


class WorkerRemote:
    """One rank's side of the remote tier: fetches, write-through puts, the start-up probe."""

    def __init__(
        self,
        store: RemoteStore,
        write_backlog: int | None,
        fetch_streams: int = 1,
        loads_first: bool = True,
        copy_threads: int = COPY_THREADS,
    ) -> None:
        """``write_backlog``: bytes of put copies that may wait (None: no puts);
        ``fetch_streams``: a load's fetches in flight at once; ``loads_first``: puts wait
        for this rank's fetches (write-through, whose chunks the local tiers keep; not
        write-back, whose puts are of chunks the CPU tier evicted); ``copy_threads``: the
        uploader's (:class:`~miniflex.remote.uploader.RemoteUploader`)."""
        self.store = store
        self._write_backlog, self._copy_threads = write_backlog, copy_threads
        self._streams = fetch_streams
        self._loads_first = loads_first
        self.fetcher: RemoteFetcher | None = None
        self.uploader: RemoteUploader | None = None
        self._pool: HostPool | None = None

    @classmethod
    def open(cls, config: MiniFlexConfig, namespace_digest: bytes) -> WorkerRemote | None:
        """This rank's store, checked (see :func:`open_checked`); None without ``remote_url``."""
        store = open_checked(config, namespace_digest)
        if store is None:
            return None
        puts = config.remote_write != "off"
        backlog = config.remote_write_backlog if puts else None
        streams = config.remote_fetch_streams or auto_fetch_streams(os.cpu_count())
        loads_first = config.remote_write == "through"
        return cls(store, backlog, streams, loads_first, config.remote_copy_threads)

    def bind(self, pool: HostPool) -> RemoteFetcher:
        """Attach to this rank's CPU pool (at registration); returns the loads' fetcher."""
        self._pool = pool
        self.fetcher = RemoteFetcher(self.store, pool, self._streams)
        if self._write_backlog is not None:
            gate = self.fetcher.gate if self._loads_first else None
            self.uploader = RemoteUploader(
                self.store, self._write_backlog, gate, self._copy_threads
            )
        return self.fetcher

    def probe(self) -> float | None:
        """Bytes/s of a chunk's fetch into a CPU slot, measured now (None: unreachable)."""
        assert self.fetcher is not None, "bind() first"
        bps = probe_fetch_bandwidth(self.fetcher)
        logger.info(
            "MiniFlex remote store %s: %s",
            self.store.url,
            "unreachable, no fetch probe" if bps is None else f"fetches at {bps / 1e9:.2f} GB/s",
        )
        return bps

    def finished(
        self,
        job: TransferJob,
        result: JobResult,
        groups: Sequence[tuple[Sequence[RemoteCopy], Callable[[], None]]],
    ) -> None:
        """A job with puts was reported (a STORE's write-through, a DEMOTE's write-back):
        ``groups`` are its puts as handed over (:func:`put_groups`), each with the callback
        to call once the uploader's copy threads have copied that group's slots; every
        callback at once when there is nothing to put (a failed job, no uploader). Until
        its callback the caller keeps a group's slots unchanged."""
        if not job.puts or self.uploader is None or not result.ok or self._pool is None:
            if job.puts and self.uploader is not None:  # the job failed: nothing to put
                self.uploader.not_put(len(job.puts))
            for _, done in groups:
                done()
            return
        pool = self._pool
        slots = [[(c.key, pool.slot(c.cpu)) for c in group] for group, _ in groups]
        for chunks, (_, done) in zip(slots, groups, strict=True):  # nothing left to raise
            self.uploader.offer_later(chunks, done)

    def take_outcome(self) -> PutOutcome:
        """What this rank's puts came to since the last call (nothing without puts)."""
        return self.uploader.take_outcome() if self.uploader is not None else PutOutcome()

    def close(self) -> None:
        """Put what is queued (bounded by the store's timeout per put), then disconnect."""
        if self.fetcher is not None:
            self.fetcher.close()
        if self.uploader is not None:
            self.uploader.close()
        self.store.close()
