"""The scheduler's lookup: a request's chunk keys, and the hit MiniFlex can load.

:class:`HitLookup` answers ``get_num_new_matched_tokens``: a prefix match of the
request's chunk keys, starting after vLLM's own GPU hit, across the CPU and SSD
tiers and then, with ``remote_url``, the remote store (asked for the chunks
after the local run, :mod:`miniflex.remote.lookup`), and how much of it to load,
and how (the :class:`~miniflex.scheduler.advisor.HitAdvisor`'s call). The answer
is a frozen :class:`~miniflex.scheduler.hits.Hit`. It touches no tier: vLLM may
ask several times. What it keeps on the request is its keys (built once,
extended as the prompt grows) and when it began waiting for a chunk landing on
SSD.

Example::

    lookup = HitLookup(ns, tiers, advisor, cost, graphs, load_mode="auto")
    hit = lookup.find(state, block_hashes, num_tokens=4097, num_computed=0)
    hit.tokens, hit.load_async   # (4064, True): vLLM loads them before computing the rest
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from miniflex.cost import CostModel, hit_cap
from miniflex.keys import Namespace, chunk_key
from miniflex.plan import LoadTiming
from miniflex.remote.lookup import RemoteLookup
from miniflex.scheduler.advisor import HitAdvisor
from miniflex.scheduler.chunk_keys import ChunkKeys
from miniflex.scheduler.cuda_graphs import GraphRule
from miniflex.scheduler.hits import Hit, tokens_by_tier
from miniflex.scheduler.requests import ReqState
from miniflex.tiers import TierStack
from miniflex.types import Tier

__all__ = ["LANDING_WAIT_S", "HitLookup", "first_chunk_held"]

LANDING_WAIT_S = 0.5
"""Longest a request's lookup waits for a chunk on its way to SSD (see ``find``)."""


class HitLookup:
    """Finds a request's hit; scheduler side, one thread."""

    def __init__(
        self,
        ns: Namespace,
        tiers: TierStack,
        advisor: HitAdvisor,
        cost: CostModel,
        graphs: GraphRule,
        load_mode: str,
        remote: RemoteLookup | None = None,
    ) -> None:
        """``remote``: the remote tier's lookup, asked after the local run (None: none)."""
        self.ns = ns
        self.tiers = tiers
        self.advisor = advisor
        self.cost = cost
        self.graphs = graphs
        self.load_mode = load_mode
        self.remote = remote

    def keys(self, st: ReqState, block_hashes: Sequence[bytes]) -> ChunkKeys:
        """The request's chunk keys, matched to its block hashes (``ChunkKeys.sync``); where
        vLLM rewrote trailing hashes, the request's store marks move back to the keys kept."""
        before = len(st.keys)
        kept = st.keys.sync(self.ns, block_hashes)
        if kept < before:
            st.stored_chunks = min(st.stored_chunks, kept)
            st.store_due = min(st.store_due, kept)
        return st.keys

    def find(
        self, st: ReqState, block_hashes: Sequence[bytes], num_tokens: int, num_computed: int
    ) -> Hit:
        """The hit beyond ``num_computed`` (vLLM's own) of a prompt of ``num_tokens``.

        ``Hit.tokens`` None: ask again in a later step. The run of resident chunks ends at
        one on its way to SSD, readable nowhere until its write is reported (within a step
        or two); waiting beats recomputing the rest of the prompt, for as long as that
        recompute would take.
        """
        st.num_computed_tokens = num_computed
        st.num_prompt_tokens = num_tokens
        if st.account.looked_up_at is None:
            st.account.looked_up_at = time.perf_counter()
        if st.prompt_end is None:
            st.prompt_end = num_tokens
        keys = self.keys(st, block_hashes)
        ct, bs = self.ns.chunk_tokens, self.ns.block_size
        start = num_computed // ct
        matched = self.tiers.match(st.keys.array[start:]) if start < len(keys) else 0
        tiers = self._residence(st, keys, start, matched)
        if self._wait_for_landing(st, keys, start + len(tiers)):
            return Hit(None, resident_by_tier=st.hit.resident_by_tier)
        if self.remote is not None and self.advisor.worth_asking(Tier.REMOTE, num_tokens):
            # the chunks after the local run that the store holds (without staging slots,
            # as many as the CPU tier can take)
            stop = len(keys) if self.tiers.stream_slots else start + self.tiers.max_load_chunks
            ask = keys[start + len(tiers) : stop]
            st.remote_answer = self.remote.ask(ask, st.remote_answer)
            tiers = tiers + [Tier.REMOTE] * st.remote_answer.held
            matched = len(tiers)
        resident = tokens_by_tier(tiers, start * ct, num_tokens, ct)
        instep = self._instep(tiers)
        if not self.tiers.stream_slots and (Tier.REMOTE in tiers or Tier.SSD in tiers):
            tiers = tiers[: self.tiers.staged_prefix(tiers)]  # every read lands in a CPU slot
        n, timing, decision = 0, LoadTiming.ASYNC, None
        if matched:
            slow = self.tiers.ssd is not None or self.remote is not None
            n, timing, decision = self.advisor.decide(
                st, tiers, num_tokens, num_computed, slow, instep
            )
        last = hit_cap(num_tokens, bs)  # vLLM computes the last token
        end = min((start + n) * ct, last)
        declined = 0
        if decision is not None:  # what it was offered and chose to recompute
            offered = min((start + decision.resident_chunks) * ct, last)
            declined = max(0, offered - max(end, num_computed))
        if end <= num_computed or (
            self.load_mode == "auto" and not self.graphs.in_step_sees_hooks(num_tokens - end)
        ):
            # auto: an in-step load only overlaps a step that runs attention eagerly
            timing = LoadTiming.ASYNC
        st.check()
        return Hit(max(0, end - num_computed), timing, decision, resident, declined)

    def _instep(self, tiers: list[Tier]) -> int:
        """How many leading chunks a load inside the step may take, SSD reads included: as
        many as CPU slots can take now (0: no SSD chunk, or workers that cannot read from SSD
        in a step: a pool several TP ranks share, ``ssd_stream_bytes=0``)."""
        if not self.tiers.stream_slots or Tier.SSD not in tiers:
            return 0
        local = tiers.index(Tier.REMOTE) if Tier.REMOTE in tiers else len(tiers)
        return self.tiers.staged_prefix(tiers[:local])

    def _residence(self, st: ReqState, keys: ChunkKeys, start: int, n: int) -> list[Tier]:
        """The tier of each of the ``n`` chunks matched from ``start`` on."""
        if not n:
            return []
        if self.tiers.ssd is None:
            return [Tier.CPU] * n
        run = st.keys.array[start : start + n]
        # exact (a chunk being promoted ends the run); the CPU prefix in one compiled call
        return self.tiers.residence(keys[start : start + n], self.tiers.cpu.match(run))

    def _wait_for_landing(self, st: ReqState, keys: ChunkKeys, end: int) -> bool:
        """True: the chunk after the resident run (``keys[end]``) is landing on SSD and the
        request has waited for it less than recomputing the rest of its prompt would take
        (by the prefill fit; LANDING_WAIT_S at least, and before a fit). Only where the disk
        keeps up with recomputing: on a slower one, the chunks on SSD save little or nothing.
        A disk's sync can stall for a while on a busy machine; the wait is worth it as long
        as it is shorter than the recompute it saves."""
        if (
            self.tiers.ssd is None
            or end >= len(keys)
            or not self.tiers.landing(keys[end])  # a dict lookup: first, on every lookup
            or not self.tiers.disk_keeps_up
        ):
            st.landing_since = None
            return False
        now = time.monotonic()
        if st.landing_since is None:
            st.landing_since = now
        done = end * self.ns.chunk_tokens
        fit = self.cost.prefill
        rest = fit.seconds(st.num_prompt_tokens - done, done) if fit is not None else 0.0
        return now - st.landing_since < max(LANDING_WAIT_S, rest)


def first_chunk_held(
    ns: Namespace, tiers: TierStack, remote: bool, block_hashes: Sequence[bytes]
) -> bool:
    """Whether a request of these block hashes may hit: the CPU or SSD tier holds its first
    chunk, or a remote store may (asking it would cost a round trip). One hash and one
    index lookup: cheap enough for vLLM to ask of every request it queues."""
    bpc = ns.blocks_per_chunk
    if len(block_hashes) < bpc:
        return False
    if remote:
        return True
    return tiers.match([chunk_key(ns, bytes(block_hashes[bpc - 1]))]) == 1
