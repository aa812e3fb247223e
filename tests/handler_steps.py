"""Driving a worker's MiniFlexHandler directly in tests: submit a plan's jobs as a step
would, and wait for what its threads do."""

from __future__ import annotations

import time

from miniflex.plan import JobKind, TransferJob, TransferPlan
from miniflex.worker.handler import MiniFlexHandler

__all__ = ["run_plan", "wait_until"]


def run_plan(h: MiniFlexHandler, step: int, *jobs: TransferJob) -> None:
    """Queue ``jobs`` as one step's plan: loads (and demotions) first, then stores."""
    plan = TransferPlan(jobs=jobs, step=step)
    h.submit(plan, JobKind.LOAD)
    h.submit(plan, JobKind.STORE)


def wait_until(done: object, what: str, timeout: float = 10.0) -> None:
    """Poll ``done()`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.005)
