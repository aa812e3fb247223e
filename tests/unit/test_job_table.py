"""JobTable: a job is committed once, after every worker reported it, with their results joined."""

from __future__ import annotations

from miniflex.config import MiniFlexConfig
from miniflex.cost import CostModel
from miniflex.keys import Namespace
from miniflex.plan import JobId, JobKind, JobResult
from miniflex.scheduler.advisor import HitAdvisor
from miniflex.scheduler.jobs import ClearRecord, CommitContext, JobTable, StoreRecord
from miniflex.scheduler.requests import ReqState
from miniflex.stats import TransferStats
from miniflex.tiers import TierStack
from miniflex.types import BlockId, ChunkKey, ReqId

NS = Namespace("m", "bfloat16", "LBHNC", 2, 2, 64, 16, 2)
WORKERS = 2


def context() -> CommitContext:
    cost = CostModel(chunk_bytes=4096, chunk_tokens=NS.chunk_tokens)
    return CommitContext(
        NS, TierStack(cpu_slots=4), TransferStats(), HitAdvisor(MiniFlexConfig(), cost)
    )


def result(job: JobId, kind: JobKind, ok: bool = True, nbytes: int = 0) -> JobResult:
    return JobResult(job, None, kind, ok, num_bytes=nbytes)


def test_ids_are_new_and_a_job_is_handed_back_only_after_every_worker_reported() -> None:
    table, ctx = JobTable(WORKERS), context()
    a, b = table.next_id(), table.next_id()
    assert a != b
    job = table.add(ClearRecord.plan(a, WORKERS))
    assert job.job_id == a and table.get(a) is not None and len(table) == 1
    assert table.report(result(a, JobKind.CLEAR), ctx) is None  # one of two
    rec = table.report(result(a, JobKind.CLEAR), ctx)
    assert rec is not None and rec.ok and len(table) == 0 and table.get(a) is None
    assert table.report(result(a, JobKind.CLEAR), ctx) is None  # a late or unknown report
    assert table.get(None) is None


def test_one_workers_failure_fails_the_job_and_every_report_is_counted() -> None:
    table, ctx = JobTable(WORKERS), context()
    st = ReqState(ReqId("r"), block_ids=[BlockId(i) for i in range(4)])
    keys = [ChunkKey(1), ChunkKey(2)]
    placed = ctx.tiers.prepare_store(keys)
    job_id = table.next_id()
    table.add(StoreRecord.plan(job_id, st, keys, placed, NS, WORKERS))
    assert table.storing_chunks() == 2
    table.report(result(job_id, JobKind.STORE, nbytes=100), ctx)
    rec = table.report(result(job_id, JobKind.STORE, ok=False, nbytes=50), ctx)
    assert rec is not None and not rec.ok
    assert (ctx.stats.stores, ctx.stats.store_bytes) == (2, 150)  # both ranks' reports
    rec.commit(ctx, st)  # rolled back: nothing becomes visible, the failure is counted
    assert ctx.tiers.match(keys) == 0 and ctx.stats.failed_jobs == 1
    assert table.storing_chunks() == 0
