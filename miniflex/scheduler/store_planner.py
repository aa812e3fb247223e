"""Store jobs: which chunks a step completes, where they go, and what could not be placed.

Part of the scheduler half (:class:`~miniflex.scheduler.manager.MiniFlexManager`
calls it from ``build_plan``); it runs in vLLM's scheduler process and never
touches KV bytes.
"""

from __future__ import annotations

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

__all__ = ["StorePlanner"]


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

    def job(
        self, st: ReqState, hashes: Sequence[bytes], done_tokens: int, stats: TransferStats
    ) -> TransferJob | None:
        """The store of ``st``'s chunks completed by ``done_tokens`` computed tokens and not
        stored yet (None: nothing to store, or nothing could be placed). Chunks skipped for
        the in-flight cap or for want of an unpinned slot are counted in ``stats`` and never
        retried: ``st.stored_chunks`` moves past them either way."""
        ns, cpu = self._ns, self._tiers.cpu
        keys = self._lookup.keys(st, hashes)
        full = min(
            len(keys), done_tokens // ns.chunk_tokens, len(st.block_ids) // ns.blocks_per_chunk
        )
        if full <= st.stored_chunks:
            return None
        if self._jobs.storing_chunks() >= self._config.max_inflight_chunks:
            stats.stores_skipped += full - st.stored_chunks
            st.stored_chunks = full  # skipped for good, not retried (and counted) every step
            return None
        first = st.stored_chunks
        st.stored_chunks = full
        # chunks of generated tokens go in coldest: they never push a prompt out
        cold_from = max(0, st.prompt_chunks(ns.chunk_tokens) - first)
        placed = self._tiers.prepare_store(keys[first:full], cold_from)
        # chunks neither placed nor already in CPU found no slot (every one pinned): lost
        done = {k for k, _ in placed}
        stats.stores_skipped += sum(
            1 for k in keys[first:full] if k not in done and k not in cpu and not cpu.is_storing(k)
        )
        if not placed:
            return None
        st.stored_tokens += len(placed) * ns.chunk_tokens
        puts = self._puts.through(len(placed), stats)
        rec = StoreRecord.plan(self._jobs.next_id(), st, keys, placed, ns, self._num_workers, puts)
        self._jobs.add(rec)
        st.store_jobs.add(rec.job.job_id)
        return rec.job
