"""StorePlanner beyond the basic scenarios, on a real TierStack: chunks that wait for a CPU
slot on their way to SSD, chunks other requests hold, and a prompt whose tail vLLM rewrote."""

from __future__ import annotations

from miniflex.config import MiniFlexConfig
from miniflex.cost import CostModel
from miniflex.keys import Namespace, chunk_key
from miniflex.plan import JobKind, JobResult, TransferJob
from miniflex.scheduler.advisor import HitAdvisor
from miniflex.scheduler.cuda_graphs import EAGER
from miniflex.scheduler.jobs import CommitContext, JobTable, LoadRecord, StoreRecord
from miniflex.scheduler.lookup import HitLookup
from miniflex.scheduler.remote_puts import RemotePuts
from miniflex.scheduler.requests import PendingLoad, ReqState
from miniflex.scheduler.store_planner import STORE_WAIT_S, StorePlanner
from miniflex.stats import TransferStats
from miniflex.tiers import ChunkSource, TierStack
from miniflex.types import BlockId, ReqId, SlotId

NS = Namespace("m", "bfloat16", "LBHNC", 2, 2, 64, block_size=16, blocks_per_chunk=2)
CT = NS.chunk_tokens
HASHES = [bytes([i + 1]) * 32 for i in range(10)]  # 5 chunks
KEYS = [chunk_key(NS, HASHES[2 * i + 1]) for i in range(5)]


class Planner:
    """A StorePlanner and what it plans on: a CPU tier of ``cpu_slots`` and, with
    ``ssd_slots``, a write-through SSD tier (one that takes every chunk stored)."""

    def __init__(self, cpu_slots: int = 8, ssd_slots: int = 0) -> None:
        cfg = MiniFlexConfig.from_dict({}, env={})
        cost = CostModel(4096, CT)
        self.stack = TierStack(cpu_slots=cpu_slots, ssd_slots=ssd_slots, write_through=True)
        self.jobs, self.stats = JobTable(1), TransferStats()
        lookup = HitLookup(NS, self.stack, HitAdvisor(cfg, cost), cost, EAGER, cfg.load_mode)
        puts = RemotePuts("off", 4096)
        self.planner = StorePlanner(cfg, NS, self.stack, self.jobs, lookup, puts, 1)
        self.ctx = CommitContext(NS, self.stack, self.stats, HitAdvisor(cfg, cost))

    def job(
        self, st: ReqState, done_tokens: int, hashes: list[bytes] = HASHES
    ) -> TransferJob | None:
        return self.planner.job(st, hashes, done_tokens, self.stats)

    def stored_and_written(self, job: TransferJob, st: ReqState) -> None:
        """The workers stored ``job`` and wrote its chunks to SSD: their CPU slots unpinned."""
        rec = self.jobs.report(JobResult(job.job_id, st.req_id, JobKind.STORE, True), self.ctx)
        assert rec is not None
        rec.commit(self.ctx, st)
        batch = self.stack.take_demotions()
        self.stack.complete_demotions(batch.copies, failed=set())


def request(name: str = "r", blocks: int = 10) -> ReqState:
    return ReqState(ReqId(name), block_ids=[BlockId(100 + b) for b in range(blocks)])


def first_blocks(job: TransferJob | None) -> list[int]:
    assert job is not None
    return [c.block_ids[0] for c in job.chunks]


def test_a_store_is_tracked_in_the_job_table_under_its_request() -> None:
    p, st = Planner(), request()
    job = p.job(st, 2 * CT)
    assert job is not None and st.store_jobs == {job.job_id}
    rec = p.jobs.get(job.job_id)
    assert isinstance(rec, StoreRecord) and [k for k, _ in rec.placed] == KEYS[:2]
    assert p.stack.match(KEYS) == 0  # invisible until every worker reported it


def test_chunks_that_find_no_slot_wait_for_one_while_the_ssd_tier_takes_chunks() -> None:
    p, st = Planner(cpu_slots=3, ssd_slots=16), request()
    first = p.job(st, 5 * CT)
    assert first_blocks(first) == [100, 102, 104]  # the tier's 3 slots, pinned by the store
    assert st.stored_chunks == 3 and st.store_waits and p.stats.stores_skipped == 0
    assert p.job(st, 5 * CT) is None  # still no slot: the chunks go on waiting
    assert first is not None
    p.stored_and_written(first, st)
    assert first_blocks(p.job(st, 5 * CT)) == [106, 108]
    assert st.stored_chunks == 5 and not st.store_waits


def test_a_finished_requests_waiting_chunks_are_stored_by_a_retry() -> None:
    p, st = Planner(cpu_slots=3, ssd_slots=16), request()
    first = p.job(st, 5 * CT)
    assert first is not None
    p.planner.waiting[st.req_id] = st  # vLLM finished it and keeps its blocks for now
    assert p.planner.retry_waiting(p.stats) == ([], [])
    p.stored_and_written(first, st)
    jobs, done = p.planner.retry_waiting(p.stats)
    assert [first_blocks(j) for j in jobs] == [[106, 108]] and done == [st]
    assert p.planner.waiting == {}


def test_chunks_that_waited_past_the_store_wait_are_dropped_and_counted() -> None:
    p, st = Planner(cpu_slots=3, ssd_slots=16), request()
    p.job(st, 5 * CT)
    assert st.store_waits_since is not None
    st.store_waits_since -= STORE_WAIT_S + 1  # no slot came for longer than vLLM keeps blocks
    assert p.job(st, 5 * CT) is None
    assert p.stats.stores_skipped == 2 and st.stored_chunks == 5 and not st.store_waits


def test_chunks_another_request_holds_or_is_storing_are_neither_stored_nor_skipped() -> None:
    p, a, b = Planner(cpu_slots=3), request("a"), request("b")
    assert first_blocks(p.job(a, 3 * CT)) == [100, 102, 104]  # a's store still in flight
    assert p.job(b, 3 * CT) is None  # the same prompt: nothing of b's to store
    assert p.stats.stores_skipped == 0 and b.stored_chunks == 3


def test_chunks_already_in_the_cpu_tier_are_not_stored_again() -> None:
    p, st = Planner(), request()
    p.stack.complete_store(p.stack.prepare_store(KEYS[:2]), ok=True)  # another request's
    job = p.job(st, 5 * CT)
    assert first_blocks(job) == [104, 106, 108]
    assert st.stored_chunks == 5 and p.stats.stores_skipped == 0


def test_a_rewritten_prompt_tail_is_stored_again_under_its_new_keys() -> None:
    p, st = Planner(), request()
    assert first_blocks(p.job(st, 5 * CT)) == [100, 102, 104, 106, 108]
    tail = [bytes([0xF0 + i]) * 32 for i in range(6)]  # vLLM replaced blocks 4.. (chunk 2 on)
    again = p.job(st, 5 * CT, [*HASHES[:4], *tail])
    assert first_blocks(again) == [104, 106, 108]
    assert again is not None
    rec = p.jobs.get(again.job_id)
    assert isinstance(rec, StoreRecord)
    assert [k for k, _ in rec.placed] == [chunk_key(NS, h) for h in tail[1::2]]


def test_a_chunk_whose_blocks_come_later_is_stored_once_they_are_allocated() -> None:
    p, st = Planner(), request(blocks=4)  # vLLM allocated blocks for 2 of the 3 chunks
    assert first_blocks(p.job(st, 3 * CT)) == [100, 102]
    st.block_ids += [BlockId(104), BlockId(105)]
    assert first_blocks(p.job(st, 3 * CT)) == [104]
    assert st.stored_chunks == 3 and p.stats.stores_skipped == 0


def test_chunks_loaded_from_ssd_are_not_stored_again_unless_vllm_rewrote_them() -> None:
    """SSD keeps what a request loaded from it, so a store of those chunks would only evict
    the CPU tier's copy of their prefix; a chunk of the prompt's tail that vLLM rewrote is
    another chunk, under a new key, and is stored."""
    p, st = Planner(), request()
    p.job(st, 0)  # the request's keys, nothing computed yet
    from_ssd = [ChunkSource(k, SlotId(20 + i), ssd=SlotId(i)) for i, k in enumerate(KEYS[:3])]
    load = PendingLoad(first_token=0, num_tokens=3 * CT, sources=from_ssd)
    LoadRecord.plan(p.jobs.next_id(), st, load, NS, 1).settle(st, NS)  # chunks 0-2 from SSD
    assert first_blocks(p.job(st, 5 * CT)) == [106, 108]
    assert p.stats.stores_skipped == 0
    tail = [bytes([0xF0 + i]) * 32 for i in range(6)]  # vLLM replaced blocks 4.. (chunk 2 on)
    assert first_blocks(p.job(st, 5 * CT, [*HASHES[:4], *tail])) == [104, 106, 108]
