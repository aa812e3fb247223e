"""vLLM's hybrid KV cache manager, per KV cache group, against ``miniflex/hybrid.py``.

vLLM's real Scheduler, with the manager on, runs a model of one full-attention
and one sliding-window group; a recording ``SupportsHMA`` connector
(``hma_stub.py``) claims external hits. These pin down what a MiniFlex that
serves the groups separately may rely on: which blocks of each group vLLM
allocates for an external hit (``GroupNeed.needed_blocks``), which blocks a
sliding-window group still holds in the step that computes them
(``GroupNeed.kept_chunks``) and when the request finishes (fewer: only the
last token's window), and the per-group block ids of
``request_finished_all_groups``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from vllm.config import KVTransferConfig
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.structured_output import StructuredOutputManager

from miniflex.hybrid import GroupNeed
from tests.connector import hma_stub
from tests.connector.engine_config import (
    BLOCK,
    HEAD,
    HEADS,
    full_attention,
    make_kv_cache_config,
    make_vllm_config,
    runner_output,
    write_model_config,
)

WINDOW, CHUNK = 4 * BLOCK, 2 * BLOCK
FULL, SLIDING = GroupNeed(), GroupNeed(WINDOW)


def make_scheduler(tmp_path: Path, max_batched: int) -> Scheduler:
    kci = pytest.importorskip("vllm.v1.kv_cache_interface")
    from vllm.utils.hashing import sha256

    vc = make_vllm_config(write_model_config(tmp_path / "model"), {}, 128, max_batched)
    vc.kv_transfer_config = KVTransferConfig(
        kv_connector="GroupRecorder",
        kv_connector_module_path="tests.connector.hma_stub",
        kv_role="kv_both",
    )
    vc.scheduler_config.disable_hybrid_kv_cache_manager = False
    sliding = kci.SlidingWindowSpec(
        block_size=BLOCK,
        num_kv_heads=HEADS,
        head_size=HEAD,
        dtype=torch.float16,
        sliding_window=WINDOW,
    )
    groups = [(["model.layers.1.attn"], full_attention()), (["model.layers.0.attn"], sliding)]
    init_none_hash(sha256)
    for record in (hma_stub.HITS, hma_stub.ALLOCATED, hma_stub.FINISHED):
        record.clear()
    return Scheduler(
        vllm_config=vc,
        kv_cache_config=make_kv_cache_config(128, groups),
        structured_output_manager=StructuredOutputManager(vc),
        block_size=BLOCK,
        log_stats=False,
    )


def add(sched: Scheduler, req_id: str, n: int, max_tokens: int = 1) -> Any:
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.request import Request

    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    sp.update_from_generation_config({}, 2)
    tokens = [(i * 7919) % 997 + 3 for i in range(n)]
    req = Request(req_id, tokens, sp, None, block_hasher=get_request_block_hasher(BLOCK, sha256))
    sched.add_request(req)
    return req


def step(sched: Scheduler) -> dict[str, tuple[list[int], ...]]:
    """One engine step; returns each scheduled request's block ids per group as its
    forward sees them."""
    so = sched.schedule()
    ids = list(so.num_scheduled_tokens)
    tables = {r: sched.kv_cache_manager.get_block_ids(r) for r in ids}
    done = [sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens for r in ids]
    sched.update_from_output(so, runner_output(ids, [[7] if d else [] for d in done]))
    return tables


def null_id(sched: Scheduler) -> int:
    return sched.kv_cache_manager.block_pool.null_block.block_id


def test_an_external_hit_gets_blocks_only_where_each_group_needs_them(tmp_path: Path) -> None:
    sched = make_scheduler(tmp_path, max_batched=512)
    hma_stub.HITS["a"] = hit = 8 * CHUNK
    add(sched, "a", hit + 2 * CHUNK + 5)
    step(sched)
    num_external, (full, sliding) = hma_stub.ALLOCATED["a"]
    assert num_external == hit
    null = null_id(sched)
    blocks = range(hit // BLOCK)
    assert [b for b in blocks if full[b] != null] == list(FULL.needed_blocks(0, hit, BLOCK))
    assert [b for b in blocks if sliding[b] != null] == list(SLIDING.needed_blocks(0, hit, BLOCK))


def test_a_sliding_group_holds_its_kept_chunks_in_the_step_that_computes_them(
    tmp_path: Path,
) -> None:
    """A chunked prefill: vLLM frees the sliding group's blocks that leave the window while
    the request runs, so MiniFlex must store them in the step that computes them (the
    chunks ``kept_chunks`` names are all still held then), not when it finishes."""
    sched = make_scheduler(tmp_path, max_batched=6 * CHUNK)
    req = add(sched, "b", 20 * CHUNK + 5)  # computed in steps ending at chunks 6, 12, 18, 20
    null, kept, freed = null_id(sched), set(), False
    while "b" in sched.requests:
        full, sliding = step(sched)["b"]
        done = req.num_computed_tokens // CHUNK  # full chunks computed by this step
        for c in set(SLIDING.kept_chunks(done, CHUNK)) - kept:
            assert all(sliding[b] != null for b in range(c * 2, c * 2 + 2)), (done, c)
            kept.add(c)
        freed |= any(b == null for b in sliding[:done])
        assert all(b != null for b in full)
    assert freed  # the window moved on: blocks were taken back while the request ran
    assert kept == {3, 4, 5, 9, 10, 11, 15, 16, 17, 18, 19}  # each step's last window
    full, sliding = hma_stub.FINISHED["b"]
    assert all(b != null for b in full)
    # At the end vLLM holds only the window of the last computed token, less than the
    # chunks a hit ending in the last chunk reads: a store at finish would come too late.
    held = [i for i, b in enumerate(sliding) if b != null]
    first = SLIDING.first_needed_token(req.num_computed_tokens) // BLOCK
    assert held == list(range(first, len(sliding)))
    assert not set(SLIDING.kept_chunks(20, CHUNK)) <= {b // 2 for b in held}
