"""Loads and stores run on threads (and movers) of their own: neither waits for the other."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from vllm.v1.request import RequestStatus

from tests.connector.engine_config import tokens
from tests.connector.harness import BLOCK, Harness, make_harness

CHUNK = 2 * BLOCK


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return make_harness(tmp_path / "model")


def wait_until_done(h: Harness, req_id: str, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while h.worker.handler.in_flight(req_id):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_load_completes_while_a_store_queued_before_it_hangs(h: Harness) -> None:
    prompt = tokens(1, 4 * CHUNK + 5)
    total = h.cached_in_miniflex_only("a", prompt)
    h.mover.store_gate.clear()  # stores hang mid-flight from here on
    h.add("c", tokens(2, 3 * CHUNK + 3), max_tokens=1)
    h.step(wait_transfers=False)  # c computes; its stores are queued and stuck
    assert h.worker.handler.in_flight("c") > 0

    b = h.add("b", prompt, max_tokens=2)
    h.step(wait_transfers=False)  # b's load is queued after c's stores
    assert h.status("b") == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert wait_until_done(h, "b"), "the load waited for a store queued before it"
    assert h.worker.handler.in_flight("c") > 0  # the store is still stuck
    assert h.loaded_blocks_match(b, 4 * CHUNK // BLOCK)
    h.step(wait_transfers=False)  # the load's completion reaches the scheduler
    so = h.step(wait_transfers=False)  # b is scheduled with its prefix loaded
    assert {r.req_id: r.num_computed_tokens for r in so.scheduled_new_reqs} == {"b": 4 * CHUNK}

    h.mover.store_gate.set()
    h.run()
    assert h.finished_and_freed("c") and h.free_blocks() == total
