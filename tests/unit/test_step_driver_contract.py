"""StepDriver beyond the basic scenarios, over a real handler whose movers are the
harness's pausable ones: what each hook waits for, and what each step reports."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from miniflex.config import MiniFlexConfig
from miniflex.plan import JobId, JobKind, LoadTiming, TransferPlan
from miniflex.types import ReqId
from miniflex.worker.handler import MiniFlexHandler
from miniflex.worker.step_driver import StepDriver
from tests.connector.movers import POISON, GatedMover
from tests.handler_steps import wait_until
from tests.unit.test_step_driver import job

BLOCKS = 8
LAYERS = ("layer.0", "layer.1")
Rank = tuple[StepDriver, GatedMover, dict[str, torch.Tensor]]


@pytest.fixture
def rank() -> Iterator[Rank]:
    kv = {name: torch.randn(BLOCKS, 1, 16, 128).to(torch.float16) for name in LAYERS}
    h = MiniFlexHandler(MiniFlexConfig(mover="cpu"))
    h.register(kv, num_slots=4, blocks_per_chunk=1)
    mover = GatedMover(h._mover, kv, h._store_mover)  # as the connector harness does
    h._mover = h._store_mover = mover
    yield StepDriver(h), mover, kv
    mover.store_gate.set()
    h.shutdown()


def run_step(d: StepDriver, plan: TransferPlan) -> tuple[set[str] | None, set[str] | None]:
    """Every hook of one step with a forward, as vLLM calls them."""
    d.bound(plan)
    d.preempted(plan)
    d.before_forward(plan)
    for name in LAYERS:
        d.layer(name)
    d.after_forward(plan)
    return d.finished(plan)


def stored(d: StepDriver, block: int, slot: int) -> None:
    """Step 1: block ``block`` stored into ``slot``, done."""
    run_step(d, TransferPlan((job(90, "s", JobKind.STORE, block, slot),), step=1))
    wait_until(lambda: d.handler.in_flight(ReqId("s")) == 0, "the store")
    d.finished(None)


def test_a_released_request_is_reported_sent_only_once_its_store_is_done(rank: Rank) -> None:
    driver, mover, _ = rank
    mover.store_gate.clear()  # the gpu-store lane's copy is still running
    plan = TransferPlan((job(1, "a", JobKind.STORE, block=2, slot=0),), step=1, release=("a",))
    assert run_step(driver, plan) == (None, None)  # vLLM must keep the blocks
    mover.store_gate.set()
    wait_until(lambda: driver.handler.in_flight(ReqId("a")) == 0, "the store")
    assert driver.finished(None) == ({"a"}, None)
    assert driver.finished(None) == (None, None)  # reported once


def test_a_preempted_requests_store_is_done_before_its_blocks_are_handed_out(
    rank: Rank,
) -> None:
    driver, mover, _ = rank
    mover.store_gate.clear()
    run_step(driver, TransferPlan((job(1, "a", JobKind.STORE, block=2, slot=0),), step=1))
    assert driver.handler.in_flight(ReqId("a")) == 1  # its copy is held at the gate

    def copy_goes_on() -> None:  # the copy resumes while vLLM's thread is in the hook
        mover.store_entered.wait()
        mover.store_gate.set()

    opener = threading.Thread(target=copy_goes_on)
    opener.start()
    driver.preempted(TransferPlan((), step=2, preempted=(ReqId("a"),)))
    assert driver.handler.in_flight(ReqId("a")) == 0  # returned only once the store was done
    opener.join()


def test_an_in_step_load_lands_each_layer_before_that_layer_runs(rank: Rank) -> None:
    driver, _, kv = rank
    stored(driver, block=2, slot=0)
    plan = TransferPlan((job(2, "b", JobKind.LOAD, 5, 0, timing=LoadTiming.LAYERWISE),), step=2)
    driver.bound(plan)
    driver.before_forward(plan)
    assert all((kv[n][5] == POISON).all() for n in LAYERS)  # nothing waited for yet
    driver.layer(LAYERS[0])
    assert torch.equal(kv[LAYERS[0]][5], kv[LAYERS[0]][2])
    assert (kv[LAYERS[1]][5] == POISON).all()
    driver.layer(LAYERS[1])
    driver.after_forward(plan)
    assert driver.finished(plan) == (None, None)  # never finished-receiving: vLLM did not wait
    assert driver.load_errors() == (set(), set())
    report = driver.report()
    assert report is not None
    assert (JobId(2), JobKind.LOAD, True) in {(r.job_id, r.kind, r.ok) for r in report[0]}


def test_a_full_graph_step_orders_every_layer_before_the_forward(rank: Rank) -> None:
    driver, _, kv = rank
    stored(driver, block=2, slot=0)
    load = job(2, "b", JobKind.LOAD, 5, 0, timing=LoadTiming.LAYERWISE)
    plan = TransferPlan((load,), step=2, full_graph=True)
    driver.bound(plan)
    driver.before_forward(plan)  # a replayed graph calls no layer hook
    assert all(torch.equal(kv[n][5], kv[n][2]) for n in LAYERS)
    driver.after_forward(plan)
    driver.finished(plan)
    assert driver.load_errors() == (set(), set())


def test_a_requests_store_is_failed_when_its_in_step_load_failed(rank: Rank) -> None:
    driver, mover, _ = rank
    stored(driver, block=2, slot=0)
    mover.fail_layerwise = True  # the load cannot be queued
    load = job(2, "b", JobKind.LOAD, 5, 0, timing=LoadTiming.LAYERWISE)
    store = job(3, "b", JobKind.STORE, block=6, slot=1)  # computed from the load's blocks
    plan = TransferPlan((load, store), step=2)
    run_step(driver, plan)
    wait_until(lambda: driver.handler.in_flight(ReqId("b")) == 0, "the store's report")
    driver.finished(None)
    assert driver.load_errors() == ({5}, {"b"})
    report = driver.report()
    assert report is not None
    by_job = {r.job_id: r for r in report[0]}
    assert not by_job[JobId(2)].ok and not by_job[JobId(3)].ok
    assert mover.calls["store"] == 1  # step 1's store only: the bad bytes never copied


def test_an_async_load_that_fails_is_received_with_its_blocks_as_load_errors(
    rank: Rank,
) -> None:
    driver, mover, _ = rank
    stored(driver, block=2, slot=0)
    mover.fail_loads = 1
    run_step(driver, TransferPlan((job(2, "b", JobKind.LOAD, block=5, slot=0),), step=2))
    wait_until(lambda: driver.handler.in_flight(ReqId("b")) == 0, "the load")
    assert driver.finished(None) == (None, {"b"})  # vLLM goes on, recomputing block 5
    assert driver.load_errors() == ({5}, {"b"})
    assert driver.load_errors() == (set(), set())  # taken once


def test_the_first_report_carries_the_probe_and_results_are_reported_once(rank: Rank) -> None:
    driver, _, _ = rank
    stored(driver, block=2, slot=0)
    first = driver.report()
    assert first is not None
    results, _steps, probes, _hook_s, _cpu_s, _puts = first
    assert len(probes) == 1 and [r.job_id for r in results] == [90]
    again = driver.report()
    assert again is None or (again[0], again[1], again[2]) == ((), (), ())
