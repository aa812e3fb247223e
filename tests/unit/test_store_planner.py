"""StorePlanner on a real TierStack: what a step's store covers, and what finds no slot."""

from __future__ import annotations

from miniflex.config import MiniFlexConfig
from miniflex.cost import CostModel
from miniflex.keys import Namespace, chunk_key
from miniflex.plan import JobKind
from miniflex.scheduler.advisor import HitAdvisor
from miniflex.scheduler.cuda_graphs import EAGER
from miniflex.scheduler.jobs import JobTable
from miniflex.scheduler.lookup import HitLookup
from miniflex.scheduler.remote_puts import RemotePuts
from miniflex.scheduler.requests import ReqState
from miniflex.scheduler.store_planner import StorePlanner
from miniflex.stats import TransferStats
from miniflex.tiers import TierStack
from miniflex.types import BlockId, ReqId

NS = Namespace("m", "bfloat16", "LBHNC", 2, 2, 64, block_size=16, blocks_per_chunk=2)
CT, BPC = NS.chunk_tokens, NS.blocks_per_chunk
HASHES = [bytes([i + 1]) * 32 for i in range(10)]  # 5 chunks
KEYS = [chunk_key(NS, HASHES[2 * i + 1]) for i in range(5)]


def planner(
    cpu_slots: int = 8, puts: str = "off", **config: object
) -> tuple[StorePlanner, TierStack, JobTable]:
    cfg = MiniFlexConfig.from_dict(dict(config), env={})
    stack, jobs, cost = TierStack(cpu_slots=cpu_slots), JobTable(1), CostModel(4096, CT)
    lookup = HitLookup(NS, stack, HitAdvisor(cfg, cost), cost, EAGER, cfg.load_mode)
    return StorePlanner(cfg, NS, stack, jobs, lookup, RemotePuts(puts, 4096), 1), stack, jobs


def request(blocks: int = 10) -> ReqState:
    return ReqState(ReqId("r"), block_ids=[BlockId(100 + b) for b in range(blocks)])


def test_each_step_stores_the_whole_chunks_it_completed_once() -> None:
    p, _stack, _jobs = planner()
    st, stats = request(), TransferStats()
    job = p.job(st, HASHES, done_tokens=2 * CT + 5, stats=stats)  # 2 whole chunks computed
    assert job is not None and job.kind is JobKind.STORE
    assert [c.block_ids for c in job.chunks] == [(100, 101), (102, 103)]
    assert p.job(st, HASHES, done_tokens=2 * CT + 20, stats=stats) is None  # nothing new
    more = p.job(st, HASHES, done_tokens=5 * CT, stats=stats)
    assert more is not None and [c.block_ids[0] for c in more.chunks] == [104, 106, 108]
    assert st.stored_chunks == 5 and st.account.stored_tokens == 5 * CT


def test_only_chunks_whose_blocks_vllm_allocated_are_stored() -> None:
    p, _stack, _jobs = planner()
    st = request(blocks=5)  # blocks for 2 whole chunks, half of a third
    job = p.job(st, HASHES, done_tokens=5 * CT, stats=TransferStats())
    assert job is not None and len(job.chunks) == 2


def test_without_an_ssd_tier_chunks_that_find_no_slot_are_counted_and_dropped() -> None:
    p, stack, _jobs = planner(cpu_slots=3)
    st, stats = request(), TransferStats()
    job = p.job(st, HASHES, done_tokens=5 * CT, stats=stats)  # its own chunks pin the tier
    assert job is not None and len(job.chunks) == 3
    assert stats.stores_skipped == 2 and st.stored_chunks == 5  # not retried every step
    assert stack.cpu.usage().pinned_or_moving == 3


def test_past_max_inflight_chunks_a_store_is_skipped_and_counted() -> None:
    p, _stack, jobs = planner(max_inflight_chunks=2)
    first, stats = request(), TransferStats()
    assert p.job(first, HASHES, done_tokens=2 * CT, stats=stats) is not None
    assert jobs.storing_chunks() == 2
    other = ReqState(ReqId("s"), block_ids=[BlockId(b) for b in range(10)])
    assert p.job(other, HASHES[::-1], done_tokens=3 * CT, stats=stats) is None
    assert stats.stores_skipped == 3 and other.stored_chunks == 3


def test_write_through_puts_ride_on_the_store() -> None:
    p, _stack, _jobs = planner(puts="through")
    stats = TransferStats()
    job = p.job(request(), HASHES, done_tokens=2 * CT, stats=stats)
    assert job is not None and [r.key for r in job.remote] == KEYS[:2]
    assert (stats.remote_puts, stats.remote_put_bytes) == (2, 2 * 4096)
