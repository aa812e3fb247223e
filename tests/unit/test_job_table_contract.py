"""JobTable beyond the basic scenarios, on a real TierStack: what a committed store or load
leaves in the tiers and on the request, and what late or unknown reports change (nothing)."""

from __future__ import annotations

import dataclasses

from miniflex.config import MiniFlexConfig
from miniflex.cost import CostModel
from miniflex.keys import Namespace
from miniflex.plan import JobId, JobKind, JobResult
from miniflex.remote.lookup import RemoteAnswer
from miniflex.scheduler.advisor import HitAdvisor
from miniflex.scheduler.jobs import ClearRecord, CommitContext, JobTable, LoadRecord, StoreRecord
from miniflex.scheduler.requests import PendingLoad, ReqState
from miniflex.stats import TransferStats
from miniflex.tiers import TierStack
from miniflex.tiers.remote_fetch import acquire_for_load
from miniflex.types import BlockId, ChunkKey, ReqId

NS = Namespace("m", "bfloat16", "LBHNC", 2, 2, 64, block_size=16, blocks_per_chunk=2)
BS, CT = NS.block_size, NS.chunk_tokens
WORKERS = 2
KEYS = [ChunkKey(i + 1) for i in range(3)]


def context(cpu_slots: int = 8) -> CommitContext:
    cost = CostModel(chunk_bytes=4096, chunk_tokens=CT)
    return CommitContext(
        NS, TierStack(cpu_slots=cpu_slots), TransferStats(), HitAdvisor(MiniFlexConfig(), cost)
    )


def request(blocks: int = 6) -> ReqState:
    return ReqState(ReqId("r"), block_ids=[BlockId(100 + b) for b in range(blocks)])


def result(job: JobId, kind: JobKind, ok: bool = True, failed: tuple[int, ...] = ()) -> JobResult:
    return JobResult(job, ReqId("r"), kind, ok, failed_block_ids=tuple(BlockId(b) for b in failed))


def report_all(
    table: JobTable, ctx: CommitContext, *results: JobResult
) -> StoreRecord | LoadRecord:
    """Every worker's report of one job; the record handed back after the last."""
    *first, last = results
    assert all(table.report(r, ctx) is None for r in first)
    rec = table.report(last, ctx)
    assert isinstance(rec, StoreRecord | LoadRecord)
    return rec


def planned_store(table: JobTable, ctx: CommitContext, st: ReqState) -> JobId:
    placed = ctx.tiers.prepare_store(KEYS)
    job_id = table.next_id()
    table.add(StoreRecord.plan(job_id, st, KEYS, placed, NS, WORKERS))
    st.store_jobs.add(job_id)
    return job_id


def test_a_store_every_worker_did_publishes_its_chunks_and_counts_their_tokens() -> None:
    table, ctx, st = JobTable(WORKERS), context(), request()
    job_id = planned_store(table, ctx, st)
    assert ctx.tiers.match(KEYS) == 0  # invisible until committed
    ok = result(job_id, JobKind.STORE)
    rec = report_all(table, ctx, ok, ok)
    rec.commit(ctx, st)
    assert ctx.tiers.match(KEYS) == 3 and ctx.stats.stored_tokens == 3 * CT
    assert st.store_jobs == set() and ctx.stats.failed_jobs == 0


def test_a_failure_reported_first_is_not_undone_by_a_later_success() -> None:
    table, ctx, st = JobTable(WORKERS), context(), request()
    job_id = planned_store(table, ctx, st)
    rec = report_all(
        table, ctx, result(job_id, JobKind.STORE, ok=False), result(job_id, JobKind.STORE)
    )
    assert not rec.ok
    rec.commit(ctx, st)
    assert ctx.tiers.match(KEYS) == 0 and ctx.stats.failed_jobs == 1


def test_a_report_for_a_job_already_handed_back_changes_nothing() -> None:
    table, ctx = JobTable(1), context()
    job_id = table.next_id()
    table.add(ClearRecord.plan(job_id, 1))
    assert table.report(result(job_id, JobKind.CLEAR), ctx) is not None
    before = (ctx.stats.failed_jobs, len(table))
    assert table.report(result(job_id, JobKind.CLEAR, ok=False), ctx) is None
    assert table.report(result(JobId(999), JobKind.LOAD, ok=False), ctx) is None
    assert (ctx.stats.failed_jobs, len(table)) == before


def test_job_ids_are_never_reused_after_jobs_are_committed() -> None:
    table, ctx = JobTable(1), context()
    seen = set()
    for _ in range(3):
        job_id = table.next_id()
        assert job_id not in seen
        seen.add(job_id)
        table.add(ClearRecord.plan(job_id, 1))
        table.report(result(job_id, JobKind.CLEAR), ctx)
    assert len(table) == 0


def test_the_table_lists_its_records_and_counts_only_store_chunks() -> None:
    table, ctx, st = JobTable(WORKERS), context(), request()
    clear_id = table.next_id()
    table.add(ClearRecord.plan(clear_id, WORKERS))
    store_id = planned_store(table, ctx, st)
    assert {r.job.job_id for r in table} == {clear_id, store_id}
    assert table.storing_chunks() == len(KEYS)
    assert isinstance(table.get(store_id), StoreRecord)


def planned_load(table: JobTable, ctx: CommitContext, st: ReqState) -> JobId:
    """A load of the 3 stored chunks (6 blocks, 96 tokens) into the request's blocks."""
    ctx.tiers.complete_store(ctx.tiers.prepare_store(KEYS), ok=True)
    sources = ctx.tiers.acquire(KEYS)
    job_id = table.next_id()
    pending = PendingLoad(first_token=0, num_tokens=3 * CT, sources=sources)
    job = table.add(LoadRecord.plan(job_id, st, pending, NS, WORKERS))
    assert job.block_ids == tuple(st.block_ids)
    return job_id


def test_a_load_with_a_failed_block_credits_only_the_blocks_before_it() -> None:
    table, ctx, st = JobTable(WORKERS), context(), request()
    st.stored_chunks = 3
    job_id = planned_load(table, ctx, st)
    rec = report_all(
        table, ctx, result(job_id, JobKind.LOAD), result(job_id, JobKind.LOAD, failed=(103,))
    )
    rec.commit(ctx, st)
    assert st.account.hit_tokens == 3 * BS and st.account.hit_by_tier == {"cpu": 3 * BS}
    assert st.stored_chunks == 1  # vLLM recomputes from block 3 (chunk 1) on: stored again
    assert ctx.tiers.cpu.usage().pinned_or_moving == 0 and ctx.tiers.match(KEYS) == 3


def test_a_failed_load_credits_nothing_and_drops_its_chunks() -> None:
    table, ctx, st = JobTable(WORKERS), context(), request()
    job_id = planned_load(table, ctx, st)
    rec = report_all(
        table, ctx, result(job_id, JobKind.LOAD), result(job_id, JobKind.LOAD, ok=False)
    )
    rec.commit(ctx, st)
    assert st.account.hit_tokens == 0 and st.load_job is None
    assert ctx.tiers.match(KEYS) == 0 and ctx.stats.failed_jobs == 1
    assert st.failed_chunks == {0, 1, 2}


def test_a_failed_fetch_drops_the_requests_remote_answer_and_a_failed_cpu_load_keeps_it() -> None:
    answer = RemoteAnswer(KEYS[0], 3, 3, at=0.0)
    for fetch in (True, False):
        table, ctx, st = JobTable(WORKERS), context(), request()
        st.remote_answer = answer
        if fetch:  # the lookup found the chunks in the remote store only
            sources = acquire_for_load(ctx.tiers, KEYS, fetch=True)
            assert [s.remote for s in sources] == [True] * 3
        else:
            ctx.tiers.complete_store(ctx.tiers.prepare_store(KEYS), ok=True)
            sources = ctx.tiers.acquire(KEYS)
        pending = PendingLoad(first_token=0, num_tokens=3 * CT, sources=sources)
        job_id = table.add(LoadRecord.plan(table.next_id(), st, pending, NS, WORKERS)).job_id
        bad = dataclasses.replace(  # chunk 1's read failed, and vLLM recomputes from it on
            result(job_id, JobKind.LOAD, failed=(102,)), failed_keys=(KEYS[1],)
        )
        report_all(table, ctx, result(job_id, JobKind.LOAD), bad).commit(ctx, st)
        assert st.account.hit_tokens == 2 * BS  # chunk 0 served either way
        assert st.remote_answer is (None if fetch else answer)  # the next ask goes to the store
