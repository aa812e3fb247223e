"""A plan's stores go to the store thread as one batch: one mover call, one result each,
issued once the forward before it is done; and a decoding request's steps that complete no
chunk plan nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.connector.engine_config import tokens
from tests.connector.harness import BLOCK, Harness, make_harness

CHUNK = 2 * BLOCK


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return make_harness(tmp_path / "model", num_blocks=128, cpu_bytes="4MiB")


def test_the_stores_of_one_step_are_one_copy_and_each_request_gets_its_chunks(
    h: Harness,
) -> None:
    prompts = {f"r{i}": tokens(10 + i, 3 * CHUNK + 1) for i in range(4)}
    for rid, p in prompts.items():
        h.add(rid, p, max_tokens=1)
    so = h.step()  # all four prefill in one step: four store jobs in its plan
    assert set(so.num_scheduled_tokens) == set(prompts)
    assert h.mover.calls["store"] == 1
    h.run()
    assert all(h.params[r]["miniflex"]["stored_tokens"] == 3 * CHUNK for r in prompts)
    assert h.sched.reset_prefix_cache()
    for i, p in enumerate(prompts.values()):  # each comes back from its own slots
        assert h.serve(f"again{i}", p) == 3 * CHUNK


def test_a_failed_batch_fails_every_job_in_it_and_frees_every_request(h: Harness) -> None:
    total = h.free_blocks()
    prompts = {f"r{i}": tokens(20 + i, 2 * CHUNK) for i in range(3)}
    for rid, p in prompts.items():
        h.add(rid, p, max_tokens=1)
    h.mover.fail_stores = 1
    h.run()
    assert h.mover.calls["store"] == 0  # the one call failed
    assert h.free_blocks() == total
    assert h.sched.reset_prefix_cache()
    for i, p in enumerate(prompts.values()):  # nothing was published: all recomputed
        assert h.serve(f"again{i}", p) == 0


def test_decode_steps_store_a_chunk_only_when_one_fills(h: Harness) -> None:
    h.add("d", tokens(30, CHUNK), max_tokens=2 * CHUNK + 1)
    planned = []
    while h.sched.requests:
        so = h.step()
        plan = so.kv_connector_metadata.plan
        planned.append(sum(len(j.chunks) for j in plan.jobs if j.kind.value == "store"))
    # the prompt's chunk at once, then one chunk of output per CHUNK decode steps
    assert planned[0] == 1
    assert sum(planned) == 3 and sum(1 for n in planned if n) == 3


def test_prefill_steps_are_timed_and_one_decode_step_in_sixteen(h: Harness) -> None:
    from miniflex.scheduler.advisor import DECODE_TIMED_EVERY

    h.add("p", tokens(40, 3 * CHUNK + 5), max_tokens=3 * DECODE_TIMED_EVERY)
    plans = []
    while h.sched.requests:
        so = h.step()
        plans.append((so.kv_connector_metadata.plan, sum(so.num_scheduled_tokens.values())))
    prefill = [p for p, n in plans if n > 1]
    decode = [p for p, n in plans if n == 1]
    assert prefill and all(p.timed for p in prefill)
    timed = [p.step for p in decode if p.timed]
    assert len(decode) >= 2 * DECODE_TIMED_EVERY
    assert timed and all(step % DECODE_TIMED_EVERY == 0 for step in timed)
    assert len(timed) <= len(decode) // DECODE_TIMED_EVERY + 1
    # the cost model still sees prefill steps' forward times
    assert h.manager_side.manager.cost.observed_steps >= len(prefill)


def test_a_batch_is_issued_only_once_the_forward_before_its_fence_is_done(h: Harness) -> None:
    """The store thread sleeps on the step's fence before it issues the copy, which holds
    the interpreter lock that vLLM's thread needs while it queues the step's sampling."""
    h.mover.fence_gate.clear()  # the prefill's forward is still running
    h.add("r", tokens(40, 2 * CHUNK), max_tokens=1)
    h.step(wait_transfers=False)
    assert h.mover.fence_waited.wait(10)
    assert not h.mover.store_entered.is_set()  # nothing issued while the forward runs
    h.mover.fence_gate.set()
    h.run()
    assert h.mover.calls["store"] == 1
    assert h.params["r"]["miniflex"]["stored_tokens"] == 2 * CHUNK
