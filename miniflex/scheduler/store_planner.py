"""Store jobs: which chunks a step completes, where they go, and what could not be placed.

Part of the scheduler half (:class:`~miniflex.scheduler.manager.MiniFlexManager`
calls it from ``build_plan``); it runs in vLLM's scheduler process and never
touches KV bytes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from miniflex.config import MiniFlexConfig
from miniflex.keys import Namespace
from miniflex.plan import TransferJob
from miniflex.scheduler.jobs import JobTable, StoreRecord
from miniflex.scheduler.lookup import HitLookup
from miniflex.scheduler.remote_puts import RemotePuts
from miniflex.scheduler.requests import ReqState
from miniflex.stats import TransferStats
from miniflex.tiers.stack import TierStack
from miniflex.types import ChunkKey, ReqId

__all__ = ["STORE_WAIT_S", "StorePlanner"]

STORE_WAIT_S = 60.0
"""Longest a request's chunks wait for a CPU slot on their way to the SSD tier or the remote
store's write-through; vLLM keeps a finished request's blocks that long at most."""


class StorePlanner:
    """Plans the STORE of the chunks a request has completed since its last store."""

    def __init__(
        self,
        config: MiniFlexConfig,
        ns: Namespace,
        tiers: TierStack,
        jobs: JobTable,
        lookup: HitLookup,
        puts: RemotePuts,
        num_workers: int,
    ) -> None:
        self._config, self._ns, self._tiers = config, ns, tiers
        self._jobs, self._lookup, self._puts = jobs, lookup, puts
        self._num_workers = num_workers
        self.waiting: dict[ReqId, ReqState] = {}
        """Finished requests whose chunks wait for CPU slots (vLLM keeps their blocks)."""

    def job(
        self, st: ReqState, hashes: Sequence[bytes], done_tokens: int, stats: TransferStats
    ) -> TransferJob | None:
        """The store of ``st``'s chunks completed by ``done_tokens`` computed tokens and not
        stored yet (None: nothing to store, or nothing could be placed). See :meth:`_plan`
        for chunks that find no slot."""
        ns = self._ns
        keys = self._lookup.keys(st, hashes)
        full = min(
            len(keys), done_tokens // ns.chunk_tokens, len(st.block_ids) // ns.blocks_per_chunk
        )
        st.store_due = max(st.store_due, full)
        if full <= st.stored_chunks:
            return None
        return self._plan(st, keys, full, stats)

    def retry_waiting(self, stats: TransferStats) -> tuple[list[TransferJob], list[ReqState]]:
        """The stores of :attr:`waiting` requests' chunks, as slots allow; and the requests
        whose last chunk is now planned (or given up), no longer waiting."""
        jobs, done = [], []
        for req_id, st in list(self.waiting.items()):
            st.store_due = min(st.store_due, len(st.block_ids) // self._ns.blocks_per_chunk)
            job = self._plan(st, st.keys, st.store_due, stats) if st.store_waits else None
            if job is not None:
                jobs.append(job)
            if not st.store_waits:
                del self.waiting[req_id]
                done.append(st)
        return jobs, done

    def _plan(
        self, st: ReqState, keys: Sequence[ChunkKey], full: int, stats: TransferStats
    ) -> TransferJob | None:
        """Place ``keys[st.stored_chunks:full]`` in CPU slots and plan their store.

        Chunks that find no unpinned slot, or meet the in-flight cap, wait (``st.stored_chunks``
        stops at the first of them, and the next step tries again) while the SSD tier or the
        remote store's write-through takes chunks, so that every chunk of a prompt larger
        than the CPU tier reaches it, until :data:`STORE_WAIT_S` has passed without one
        placed; otherwise, or past that, they are counted in ``stats`` and dropped for good.
        """
        if self._jobs.storing_chunks() >= self._config.max_inflight_chunks:
            if self._may_wait(st, progress=False):
                return None
            held = st.account.loaded_below_cpu
            stats.stores_skipped += sum(keys[i] not in held for i in range(st.stored_chunks, full))
            st.stored_chunks = full  # skipped for good, not retried (and counted) every step
            st.store_waits_since = None
            return None
        ns, cpu, first = self._ns, self._tiers.cpu, st.stored_chunks
        # SSD and the store keep what the request loaded from them; those in CPU (a promoted
        # or fetched head) stay in the list, so that placing the rest never evicts them
        held = st.account.loaded_below_cpu
        todo = [i for i in range(first, full) if keys[i] not in held or keys[i] in cpu]
        # chunks of generated tokens go in coldest: they never push a prompt out
        prompt = st.prompt_chunks(ns.chunk_tokens)
        placed = self._tiers.prepare_store([keys[i] for i in todo], sum(i < prompt for i in todo))
        # chunks neither placed nor already in CPU found no slot (every one pinned)
        done = {k for k, _ in placed}
        missed = [
            i
            for i in todo
            if keys[i] not in done and keys[i] not in cpu and not cpu.is_storing(keys[i])
        ]
        st.stored_chunks = full
        if not missed:
            st.store_waits_since = None
        elif self._may_wait(st, progress=bool(placed)):
            st.stored_chunks = missed[0]  # prepare_store stops at the first miss
        else:
            stats.stores_skipped += len(missed)
            st.store_waits_since = None
        if not placed:
            return None
        st.account.stored_tokens += len(placed) * ns.chunk_tokens
        puts = self._puts.through(len(placed), stats)
        rec = StoreRecord.plan(self._jobs.next_id(), st, keys, placed, ns, self._num_workers, puts)
        self._jobs.add(rec)
        st.store_jobs.add(rec.job.job_id)
        return rec.job

    def _may_wait(self, st: ReqState, progress: bool) -> bool:
        """Whether chunks that found no CPU slot wait for one (see :meth:`_plan`);
        ``progress``: some were placed just now (the wait starts again)."""
        if not (self._tiers.ssd_takes_chunks or self._puts.takes_chunks):
            st.store_waits_since = None
            return False
        now = time.monotonic()
        if st.store_waits_since is None or progress:
            st.store_waits_since = now
        return now - st.store_waits_since < STORE_WAIT_S
