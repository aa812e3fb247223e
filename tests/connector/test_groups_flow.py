"""A sliding-window + full-attention model's two KV cache groups, through vLLM's real Scheduler.

vLLM's hybrid KV cache manager is on (``MiniFlexHMAConnector``); the "model" is
a stand-in that writes, for every block it computes, a page whose bytes are a
function of the block's prefix hash and layer. A hit must put back, bit for bit,
every page the next forward reads: the whole prefix of the full-attention layer
and the window of the sliding-window layer, and the sliding-window group must
have stored only its windows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from vllm import SamplingParams
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from miniflex.connector import MiniFlexHMAConnector, compat
from miniflex.connector.hma_groups import MiniFlexGroupsConnector
from miniflex.hybrid import GroupNeed
from miniflex.keys import chunk_key
from tests.connector.engine_config import (
    BLOCK,
    HEAD,
    HEADS,
    full_attention,
    make_kv_cache_config,
    make_vllm_config,
    runner_output,
    tokens,
    write_model_config,
)
from tests.connector.movers import GatedMover

WINDOW, CHUNK, NUM_BLOCKS = 4 * BLOCK, 2 * BLOCK, 96
LAYERS = ("model.layers.0.attn", "model.layers.1.attn")  # group 0: sliding window, 1: full
NEEDS = (GroupNeed(WINDOW), GroupNeed())


class Engine:
    """vLLM's Scheduler and one worker, stepped in vLLM's hook order."""

    def __init__(
        self, tmp_path: Path, max_batched: int, events: Any = None, **settings: Any
    ) -> None:
        """``events``: vLLM's ``KVEventsConfig`` (None: no KV events); ``settings``: MiniFlex's,
        over the defaults here."""
        from vllm.v1.kv_cache_interface import SlidingWindowSpec

        extra = {"cpu_bytes": "2MiB", "blocks_per_chunk": 2, **settings}
        model = write_model_config(tmp_path / "model")
        vc = make_vllm_config(model, extra, NUM_BLOCKS, max_batched, "MiniFlexHMAConnector")
        vc.scheduler_config.disable_hybrid_kv_cache_manager = False
        vc.kv_events_config = events
        sliding = SlidingWindowSpec(
            block_size=BLOCK,
            num_kv_heads=HEADS,
            head_size=HEAD,
            dtype=torch.float16,
            sliding_window=WINDOW,
        )
        groups = [([LAYERS[0]], sliding), ([LAYERS[1]], full_attention())]
        kcc = make_kv_cache_config(NUM_BLOCKS, groups)
        init_none_hash(sha256)
        self.worker = MiniFlexHMAConnector(vc, KVConnectorRole.WORKER, kcc)
        assert isinstance(self.worker, MiniFlexGroupsConnector)
        self.kv = {n: torch.zeros(NUM_BLOCKS, HEADS, BLOCK, 2 * HEAD).half() for n in LAYERS}
        self.worker.register_kv_caches(self.kv)
        self.sched = Scheduler(
            vllm_config=vc,
            kv_cache_config=kcc,
            structured_output_manager=StructuredOutputManager(vc),
            block_size=BLOCK,
            log_stats=False,
        )
        self.requests: dict[str, Request] = {}
        self.params: dict[str, dict] = {}
        self.read: dict[tuple[str, int, int], torch.Tensor] = {}
        """(request, group, block) -> the page the request's last forward read."""

    def add(self, req_id: str, tokens: list[int], sched: bool = True) -> Request:
        """A request, added to vLLM's scheduler unless ``sched`` is False."""
        sp = SamplingParams(max_tokens=1, ignore_eos=True)
        sp.update_from_generation_config({}, 2)
        hasher = get_request_block_hasher(BLOCK, sha256)
        req = self.requests[req_id] = Request(req_id, tokens, sp, None, block_hasher=hasher)
        if sched:
            self.sched.add_request(req)
        return req

    @staticmethod
    def page(req: Request, block: int, group: int) -> torch.Tensor:
        seed = int.from_bytes(bytes(req.block_hashes[block])[:6], "little") + group
        return torch.randn(HEADS, BLOCK, 2 * HEAD, generator=torch.Generator().manual_seed(seed))

    def compute(self, so: Any) -> None:
        """Each group's layer reads what its attention needs, then writes the new blocks."""
        for req_id, n in so.num_scheduled_tokens.items():
            req, tables = self.requests[req_id], self.sched.kv_cache_manager.get_block_ids(req_id)
            start, end = req.num_computed_tokens - n, req.num_computed_tokens
            for g, (layer, need) in enumerate(zip(LAYERS, NEEDS, strict=True)):
                t = self.kv[layer]
                for b in need.needed_blocks(0, start // BLOCK * BLOCK, BLOCK):
                    self.read[(req_id, g, b)] = t[tables[g][b]].clone()
                for b in range(start // BLOCK, min(end // BLOCK, len(req.block_hashes))):
                    t[tables[g][b]] = self.page(req, b, g).half()

    def gate(self, g: int) -> GatedMover:
        """Make group ``g``'s transfers pausable (clear the returned mover's ``gate``)."""
        handler = self.worker.parts[g].handler
        mover = GatedMover(handler._mover, self.kv, handler._store_mover)
        handler._mover = handler._store_mover = mover
        return mover

    def free_blocks(self) -> int:
        return self.sched.kv_cache_manager.block_pool.get_num_free_blocks()

    def step(self, drain: bool = True) -> Any:
        so = self.sched.schedule()
        w = self.worker
        w.bind_connector_metadata(so.kv_connector_metadata)
        w.start_load_kv(None)
        self.compute(so)
        w.wait_for_save()
        for part in w.parts if drain else ():
            part.handler.drain()
        out = KVConnectorOutput()
        if compat.transfer_results_class() is not None:  # as vLLM 0.30+ asks
            results = w.get_transfer_results(so.finished_req_ids)
            out.finished_sending, out.finished_recving = (
                results.finished_sending,
                results.finished_recving,
            )
            out.failed_recving = results.failed_recving
        else:
            out.finished_sending, out.finished_recving = w.get_finished(so.finished_req_ids)
        out.invalid_block_ids = w.get_block_ids_with_load_errors()
        out.kv_connector_worker_meta = w.build_connector_worker_meta()
        w.clear_connector_metadata()
        ids = list(so.num_scheduled_tokens)
        done = [self.requests[r].num_computed_tokens >= self.requests[r].num_tokens for r in ids]
        sampled = [[7] if d else [] for d in done]
        outputs = self.sched.update_from_output(so, runner_output(ids, sampled, out))
        for eco in outputs.values():
            for o in eco.outputs:
                if o.kv_transfer_params:
                    self.params[o.request_id] = o.kv_transfer_params["miniflex"]
        return so

    def run(self) -> None:
        for _ in range(100):
            if not self.sched.requests and not self.sched.connector.has_pending_push_work():
                return
            self.step()
        raise AssertionError(f"not idle: {list(self.sched.requests)}")


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    if compat.hma_base() is None:
        pytest.skip("this vLLM has no SupportsHMA")
    return Engine(tmp_path, max_batched=4 * CHUNK)


def load_and_check(
    engine: Engine, stored: Request, req_id: str, hit: int, loaded: int | None = None
) -> None:
    """Serve ``req_id`` (``stored``'s prompt) from a hit of ``hit`` tokens, ``loaded`` of them
    by MiniFlex (None: all): the forward after its load reads exactly the stored pages, in
    both groups."""
    engine.add(req_id, list(stored.prompt_token_ids))
    so = engine.step()  # the load is queued (and done)
    assert not so.num_scheduled_tokens  # nothing computed while its KV loads
    assert engine.requests[req_id].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    so = engine.step()  # the rest is computed from the loaded prefix
    assert {r.req_id: r.num_computed_tokens for r in so.scheduled_new_reqs} == {req_id: hit}
    for g, need in enumerate(NEEDS):
        blocks = need.needed_blocks(0, hit, BLOCK)
        assert blocks and all(
            torch.equal(engine.read[(req_id, g, i)], engine.page(stored, i, g).half())
            for i in blocks
        )
    engine.run()
    assert engine.params[req_id]["hit_tokens"] == (hit if loaded is None else loaded)
    parts = engine.sched.connector.parts
    assert all(p.manager.cpu.usage().pinned_or_moving == 0 for p in parts)


def test_a_hit_restores_the_full_prefix_and_the_window_bit_for_bit(engine: Engine) -> None:
    a = engine.add("a", tokens(1, 10 * CHUNK + 5))  # prefilled in steps ending at chunks 4, 8, 10
    engine.run()
    kept = set().union(*(set(NEEDS[0].kept_chunks(d, CHUNK)) for d in (4, 8, 10)))
    assert kept == {1, 2, 3, 5, 6, 7, 8, 9}  # chunks 0 and 4 no window of a boundary reads
    assert engine.params["a"]["stored_tokens_by_group"] == [len(kept) * CHUNK, 10 * CHUNK]
    assert engine.sched.reset_prefix_cache()
    load_and_check(engine, a, "b", 10 * CHUNK)


def test_a_window_missing_from_its_tier_shortens_the_hit_to_a_window_held(engine: Engine) -> None:
    a = engine.add("a", tokens(2, 10 * CHUNK + 5))
    engine.run()
    assert engine.sched.reset_prefix_cache()
    sliding = engine.sched.connector.parts[0].manager
    chunk9 = chunk_key(sliding.ns, bytes(a.block_hashes[9 * 2 + 1]))  # keyed by its last block
    assert sliding.cpu.drop(chunk9)  # the window before chunk 10 is gone; before 9 is whole
    load_and_check(engine, a, "b", 9 * CHUNK)


def test_a_hit_extends_vllm_own_hit_in_both_groups(engine: Engine) -> None:
    """vLLM still holds the first 4 chunks (another request's); MiniFlex loads the rest:
    the full-attention group from chunk 4 on, the sliding-window group its last window."""
    prompt = tokens(3, 10 * CHUNK + 5)
    a = engine.add("a", prompt)
    engine.run()
    assert engine.sched.reset_prefix_cache()
    engine.add("x", prompt[: 4 * CHUNK + 1])  # vLLM caches its first 4 chunks again
    engine.run()
    load_and_check(engine, a, "b", 10 * CHUNK, loaded=6 * CHUNK)


def test_a_request_waits_for_every_group_load(engine: Engine) -> None:
    """vLLM learns that a load finished only once every group's has: a request whose
    full-attention group is loaded waits for its sliding-window group's window."""
    a = engine.add("a", tokens(4, 10 * CHUNK + 5))
    engine.run()
    assert engine.sched.reset_prefix_cache()
    sliding = engine.gate(0)
    sliding.gate.clear()  # the sliding-window group's load hangs mid-flight
    engine.add("b", list(a.prompt_token_ids))
    engine.step(drain=False)
    engine.worker.parts[1].handler.drain()  # the full-attention group's load is done
    for _ in range(3):
        assert not engine.step(drain=False).num_scheduled_tokens
    assert engine.requests["b"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    sliding.gate.set()
    engine.run()
    for g, need in enumerate(NEEDS):
        assert all(
            torch.equal(engine.read[("b", g, i)], engine.page(a, i, g).half())
            for i in need.needed_blocks(0, 10 * CHUNK, BLOCK)
        )


def test_a_request_aborted_while_one_group_loads_keeps_its_blocks_until_it_is_done(
    engine: Engine,
) -> None:
    prompt = tokens(5, 10 * CHUNK + 5)
    engine.add("a", prompt)
    engine.run()
    assert engine.sched.reset_prefix_cache()
    total = engine.free_blocks()
    main = engine.sched.connector.parts[engine.sched.connector.main].manager
    held = main.totals.blocks_held_requests + main.stats.blocks_held_requests  # a's
    sliding = engine.gate(0)
    sliding.gate.clear()
    engine.add("b", prompt)
    engine.step(drain=False)
    engine.worker.parts[1].handler.drain()
    engine.sched.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    engine.step(drain=False)
    assert "b" in engine.sched.requests and engine.free_blocks() < total
    sliding.gate.set()
    engine.run()
    assert "b" not in engine.sched.requests and engine.free_blocks() == total
    parts = engine.sched.connector.parts
    assert all(p.manager.cpu.usage().pinned_or_moving == 0 for p in parts)
    # b's hold is counted once, where counters are reported, and no group holds it still
    assert main.totals.blocks_held_requests + main.stats.blocks_held_requests == held + 1
    assert all(len(p.scheduler._held) == 0 for p in parts)


def test_blocks_kept_for_the_window_group_alone_are_counted_once(engine: Engine) -> None:
    """The full-attention group's load is done when the request is aborted, the window
    group's is not: vLLM keeps the blocks for that group alone, and the hold is counted
    where counters are reported (the full-attention group's), once."""
    prompt = tokens(6, 10 * CHUNK + 5)
    engine.add("a", prompt)
    engine.run()
    assert engine.sched.reset_prefix_cache()
    conn = engine.sched.connector
    main = conn.parts[conn.main].manager
    held = main.totals.blocks_held_requests + main.stats.blocks_held_requests
    sliding = engine.gate(0)
    sliding.gate.clear()
    engine.add("b", prompt)
    engine.step(drain=False)
    engine.worker.parts[1].handler.drain()
    engine.step(drain=False)  # the full-attention group's load result comes back
    engine.sched.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    engine.step(drain=False)
    assert "b" in engine.sched.requests
    sliding.gate.set()
    engine.run()
    assert "b" not in engine.sched.requests
    assert main.totals.blocks_held_requests + main.stats.blocks_held_requests == held + 1


def test_a_request_the_main_group_passes_over_is_looked_up_in_no_other_group(
    engine: Engine,
) -> None:
    """Backfill is the full-attention group's: a request it passes over (one as big as a
    request that did not fit) costs the other groups no lookup."""
    conn = engine.sched.connector
    assert isinstance(conn, MiniFlexGroupsConnector)
    main, other = conn.parts[conn.main], conn.parts[1 - conn.main]
    assert other.scheduler.backfill.wait_s == 0 and main.scheduler.backfill.wait_s > 0
    main.scheduler.backfill.asked("earlier", 10)
    main.scheduler.backfill.end_step()  # "earlier" needed 10 blocks and was not admitted
    req = engine.add("big", tokens(9, 12 * BLOCK), sched=False)
    assert conn.get_num_new_matched_tokens(req, 0) == (None, False)
    assert other.manager.find_state("big") is None and main.manager.find_state("big") is None
    assert main.manager.stats.backfill_passes == 1
