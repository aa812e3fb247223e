"""MiniFlex under vLLM's CUDA graphs: full graphs kept, and never a load they would skip.

Each step is dispatched by vLLM's own ``CudagraphDispatcher`` configured as on a GPU
(``FULL_AND_PIECEWISE``, vLLM's default). A step it replays as a full graph calls no
``wait_for_layer_load``, and the harness's mover lands a layer of an in-step load only
when that layer is waited for: a forward that relied on the hook in such a step reads
the blocks' old bytes (``Harness.read_matches`` fails).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from vllm.v1.request import Request, RequestStatus

from miniflex.connector import MiniFlexConnector
from miniflex.plan import JobKind, LoadTiming
from miniflex.scheduler.requests import ReqState
from miniflex.types import ReqId
from tests.connector.engine_config import tokens
from tests.connector.harness import BLOCK, Harness, make_harness

CHUNK = 2 * BLOCK


def load_jobs(h: Harness, so) -> list:
    return [j for j in so.kv_connector_metadata.plan.jobs if j.kind is JobKind.LOAD]


def start_decoding(h: Harness, n: int = 2) -> None:
    """``n`` short requests that are past their prefill and decode one token a step."""
    for i in range(n):
        h.add(f"d{i}", tokens(100 + i, BLOCK + 3), max_tokens=40)
    for _ in range(4):
        h.step()
    assert all(h.status(f"d{i}") == RequestStatus.RUNNING for i in range(n))
    assert h.modes[-1] == "FULL"  # decoding alone replays full graphs


def hit_among_decodes(
    tmp_path: Path, mode: str, prompt: list[int], extra: dict | None = None
) -> tuple[Harness, Request]:
    """``prompt`` cached in MiniFlex only, then sent again beside two decoding requests,
    under vLLM's default CUDA graphs; returns the harness and that request."""
    h = make_harness(
        tmp_path / "model", load_mode=mode, cudagraphs="FULL_AND_PIECEWISE", extra=extra
    )
    h.cached_in_miniflex_only("warm", prompt)
    start_decoding(h)
    return h, h.add("c", prompt, max_tokens=3)


@pytest.mark.parametrize("mode", ["auto", "layerwise", "sync", "async"])
def test_vllm_keeps_full_cuda_graphs_whatever_the_load_mode(mode: str) -> None:
    assert MiniFlexConnector.requires_piecewise_for_cudagraph({"load_mode": mode}) is False


def test_auto_loads_a_whole_prompt_hit_async_among_decodes(tmp_path: Path) -> None:
    """A hit of all but the last token leaves one token to compute: beside decodes that
    step replays a full graph, so ``auto`` loads it before, never inside, the step."""
    h, c = hit_among_decodes(tmp_path, "auto", tokens(1, 5 * CHUNK + 1))
    so = h.step()
    assert [j.timing for j in load_jobs(h, so)] == [LoadTiming.ASYNC]
    for _ in range(3):
        h.step()
        if c.num_computed_tokens > 5 * CHUNK:
            break
    assert h.modes[-1] == "FULL"
    assert h.read_matches(c, 5 * CHUNK // BLOCK)


@pytest.mark.parametrize("mode", ["layerwise", "sync"])
def test_an_in_step_load_in_a_full_graph_step_is_waited_for_before_the_forward(
    tmp_path: Path, mode: str
) -> None:
    """Asked for explicitly, an in-step load may land in a step replayed as a full graph:
    the plan says so, and the worker orders the whole forward after the load."""
    h, c = hit_among_decodes(tmp_path, mode, tokens(2, 5 * CHUNK + 1))
    h.mover.log.clear()
    so = h.step()
    assert [j.timing for j in load_jobs(h, so)] == [LoadTiming(mode)]
    assert so.num_scheduled_tokens == {"d0": 1, "d1": 1, "c": 1}
    assert h.modes[-1] == "FULL"
    assert so.kv_connector_metadata.plan.full_graph
    assert not any(kind == "read" for kind, _ in h.mover.log)  # no hook ran in the forward
    assert h.read_matches(c, 5 * CHUNK // BLOCK)
    assert h.load_errors == 0
    h.run()
    assert h.params["c"]["miniflex"]["hit_tokens"] == 5 * CHUNK


def test_auto_still_loads_layer_by_layer_in_a_prefill_step(tmp_path: Path) -> None:
    """A hit followed by real prefill makes a mixed batch (piecewise graphs, hooks run):
    ``auto`` keeps overlapping the load with that computation where the computation hides
    it (a prefill of 100 tokens/s: the decodes beside it lose nothing to the load). The load
    speed is fixed too: the start-up probe's, on a busy machine, can make layer-by-layer
    loads look slow enough that async is the right choice."""
    slow = {"prefill_tokens_per_s": 100, "cpu_load_gbps": 1.0}
    h, c = hit_among_decodes(tmp_path, "auto", tokens(3, 5 * CHUNK + 10), slow)
    so = h.step()
    assert [j.timing for j in load_jobs(h, so)] == [LoadTiming.LAYERWISE]
    assert h.modes[-1] == "PIECEWISE"
    assert not so.kv_connector_metadata.plan.full_graph
    assert h.read_matches(c, 5 * CHUNK // BLOCK)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mode", ["auto", "layerwise", "sync"])
def test_every_forward_reads_exact_bytes_under_full_graphs(
    tmp_path: Path, mode: str, seed: int
) -> None:
    """Random arrivals over ten prompts beside two long decodes, in a GPU cache that holds
    about five prompts (vLLM evicts, so hits come from MiniFlex): whatever each step is
    dispatched as, every scheduled request reads exactly the bytes its prefix computed."""
    rng = random.Random(seed)
    h = make_harness(
        tmp_path / "model",
        num_blocks=48,
        cpu_bytes="4MiB",
        load_mode=mode,
        cudagraphs="FULL_AND_PIECEWISE",
    )
    lengths = [3 * CHUNK + 1, 4 * CHUNK + 1, 3 * CHUNK + 9]  # a whole hit leaves 1 token
    pool = [tokens(10 + i, rng.choice(lengths)) for i in range(10)]
    for i in range(2):
        h.add(f"long{i}", tokens(90 + i, 20), max_tokens=150)
    added = loads = in_step = full_with_loads = 0
    for _ in range(160):
        if added < 24 and rng.random() < 0.4:
            h.add(f"r{added}", rng.choice(pool), max_tokens=rng.randint(1, 6))
            added += 1
        so = h.step()
        plan = so.kv_connector_metadata.plan
        jobs = [j for j in plan.jobs if j.kind is JobKind.LOAD]
        loads += len(jobs)
        in_step += sum(1 for j in jobs if j.synchronous)
        full_with_loads += plan.full_graph
        for r, n in so.num_scheduled_tokens.items():
            req = h.requests[r]
            done = (req.num_computed_tokens - n) // BLOCK
            assert h.read_matches(req, min(done, len(req.block_hashes))), (r, h.modes[-1])
        if added == 24 and len(h.sched.requests) <= 2:
            break
    assert added == 24 and loads > 0
    assert h.load_errors == 0  # no load was given up on (and so recomputed)
    # auto never puts an in-step load into a full graph; forced modes meet the case
    assert full_with_loads == 0 if mode == "auto" else in_step > 0 and full_with_loads > 0


def test_an_in_step_load_is_weighed_against_the_requests_it_would_hold_up(
    tmp_path: Path,
) -> None:
    """The advisor counts the requests running beside a new one (the last step's, not yet
    finished): an in-step load would make each of them wait for its copies."""
    h, c = hit_among_decodes(tmp_path, "auto", tokens(4, 5 * CHUNK + 10))
    advisor = h.manager_side.manager.advisor
    st = ReqState(ReqId("c"))
    assert advisor.running_besides(st) == 2  # d0 and d1 decode
    h.sched.finish_requests("d0", RequestStatus.FINISHED_ABORTED)
    assert advisor.running_besides(st) == 1
    # uncalibrated (no prefill fit yet), the hit does not go into the decodes' step
    so = h.step()
    assert [j.timing for j in load_jobs(h, so)] == [LoadTiming.ASYNC]
    for _ in range(4):
        h.step()
        if c.num_computed_tokens > 5 * CHUNK:
            break
    assert h.read_matches(c, 5 * CHUNK // BLOCK)
