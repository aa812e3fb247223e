"""StepDriver: one engine step's worker hooks, in vLLM's order, over a real handler."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from miniflex.config import MiniFlexConfig
from miniflex.plan import ChunkMove, JobId, JobKind, LoadTiming, TransferJob, TransferPlan
from miniflex.types import BlockId, ReqId, SlotId
from miniflex.worker.handler import MiniFlexHandler
from miniflex.worker.step_driver import CLOCK_REPORT_S, StepDriver
from tests.handler_steps import wait_until

BLOCKS = 8


@pytest.fixture
def driver() -> Iterator[StepDriver]:
    kv = {f"layer.{i}": torch.randn(BLOCKS, 1, 16, 128).to(torch.float16) for i in range(2)}
    h = MiniFlexHandler(MiniFlexConfig(mover="cpu"))
    h.register(kv, num_slots=4, blocks_per_chunk=1)
    d = StepDriver(h)
    d.report()  # the start-up probe's report
    yield d
    h.shutdown()


def job(i: int, req: str, kind: JobKind, block: int, slot: int, **kw: object) -> TransferJob:
    chunk = ChunkMove(SlotId(slot), (BlockId(block),))
    return TransferJob(JobId(i), ReqId(req), kind, (chunk,), **kw)  # type: ignore[arg-type]


def run_step(d: StepDriver, plan: TransferPlan) -> tuple[set[str] | None, set[str] | None]:
    """Every hook of one step with a forward, as vLLM calls them."""
    d.bound(plan)
    d.preempted(plan)
    d.before_forward(plan)
    d.layer("layer.0")
    d.layer("layer.1")
    d.after_forward(plan)
    return d.finished(plan)


def test_a_step_stores_after_its_forward_and_releases_once_stored(driver: StepDriver) -> None:
    plan = TransferPlan((job(1, "a", JobKind.STORE, block=2, slot=0),), step=1, release=("a",))
    sending, _ = run_step(driver, plan)
    if sending is None:  # the store was still running
        wait_until(lambda: driver.handler.in_flight(ReqId("a")) == 0, "the store")
        sending, _ = driver.finished(None)
    assert sending == {"a"}
    report = driver.report()
    assert report is not None
    results, steps, _probes, _hook_s, _cpu_s, _puts = report
    assert [(r.job_id, r.kind, r.ok) for r in results] == [(1, JobKind.STORE, True)]
    assert [s for s, _ in steps] == [1]  # the step's forward was timed


def test_an_async_load_is_reported_received_in_a_later_step(driver: StepDriver) -> None:
    run_step(driver, TransferPlan((job(1, "a", JobKind.STORE, block=2, slot=0),), step=1))
    wait_until(lambda: driver.handler.in_flight(ReqId("a")) == 0, "the store")
    run_step(driver, TransferPlan((job(2, "b", JobKind.LOAD, block=5, slot=0),), step=2))
    wait_until(lambda: driver.handler.in_flight(ReqId("b")) == 0, "the load")
    assert driver.finished(None) == (None, {"b"})
    assert driver.load_errors() == (set(), set())


def test_a_step_without_a_forward_still_stores_and_fails_its_in_step_loads(
    driver: StepDriver,
) -> None:
    """vLLM 0.26 skips start_load_kv and wait_for_save on a step that computes nothing."""
    in_step = job(2, "b", JobKind.LOAD, block=5, slot=1, timing=LoadTiming.LAYERWISE)
    store = job(1, "a", JobKind.STORE, block=2, slot=0)
    plan = TransferPlan((store, in_step), step=1, release=("a",), forward=False)
    driver.bound(plan)
    first, _ = driver.finished(plan)  # the only hook that comes; a quick store is done already
    assert driver.load_errors() == ({5}, {"b"})  # never read unloaded
    wait_until(lambda: driver.handler.in_flight(ReqId("a")) == 0, "the store")
    later, _ = driver.finished(None)
    assert (first or set()) | (later or set()) == {"a"}  # reported once, by one of the two
    assert first is None or later is None


def test_a_forward_without_miniflex_metadata_queues_nothing(driver: StepDriver) -> None:
    driver.after_forward(None)  # a drafter's forward
    assert driver.finished(None) == (None, None)


def test_clocks_alone_wait_until_they_are_worth_a_report(driver: StepDriver) -> None:
    driver.hook_seconds = CLOCK_REPORT_S / 4
    assert driver.report() is None
    driver.hook_seconds += CLOCK_REPORT_S * 3 / 4  # kept until a report carries them
    report = driver.report()
    assert report is not None and report[3] == pytest.approx(CLOCK_REPORT_S) and report[0] == ()
    assert driver.hook_seconds == 0.0
