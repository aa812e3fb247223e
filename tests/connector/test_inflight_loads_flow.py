"""``may_load_async`` and vLLM 0.34's ``--max-num-inflight-kv-loads`` through the real Scheduler.

vLLM 0.34 asks a connector, as it queues each request, whether the request may
load asynchronously; with ``max_num_inflight_kv_loads`` set, such requests wait
in a queue of their own and may start loading while the running batch is full.
MiniFlex says yes exactly when a tier holds the prompt's first chunk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tests.connector.harness as harness_module
from tests.connector.engine_config import tokens
from tests.connector.harness import BLOCK, make_harness

CHUNK = 2 * BLOCK


def test_may_load_async_says_yes_where_a_tier_holds_the_first_chunk(tmp_path: Path) -> None:
    h = make_harness(tmp_path / "model")
    prompt = tokens(1, 4 * CHUNK + 3)
    h.cached_in_miniflex_only("a", prompt)
    conn = h.manager_side
    assert conn.may_load_async(h.add("again", prompt, sched=False))
    assert not conn.may_load_async(h.add("fresh", tokens(2, 4 * CHUNK + 3), sched=False))
    assert not conn.may_load_async(h.add("short", prompt[: CHUNK - 1], sched=False))


def test_inflight_loads_are_capped_and_every_hit_loads_bit_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = harness_module.make_vllm_config

    def config(*args: Any, **kwargs: Any) -> Any:
        vc = real(*args, **kwargs)
        if not hasattr(vc.scheduler_config, "max_num_inflight_kv_loads"):
            pytest.skip("this vLLM has no --max-num-inflight-kv-loads (0.34+)")
        vc.scheduler_config.max_num_inflight_kv_loads = 1
        return vc

    monkeypatch.setattr(harness_module, "make_vllm_config", config)
    h = make_harness(tmp_path / "model", cpu_bytes="4MiB")
    prompts = {f"p{i}": tokens(10 + i, 4 * CHUNK + 3) for i in range(3)}
    for req_id, prompt in prompts.items():
        h.cached_in_miniflex_only(req_id, prompt)
    for req_id, prompt in prompts.items():  # all at once: one load in flight at a time
        h.add(f"{req_id}-again", prompt, max_tokens=2)
    loading = []
    for _ in range(40):
        so = h.step()
        loading.append(sum(1 for r in h.requests.values() if r.status.name.endswith("KVS")))
        for new in so.scheduled_new_reqs:
            assert h.loaded_blocks_match(h.requests[new.req_id], new.num_computed_tokens // BLOCK)
        if not h.sched.requests and not h.manager_side.has_pending_push_work():
            break
    assert max(loading) == 1, loading
    for req_id in prompts:
        assert h.params[f"{req_id}-again"]["miniflex"]["hit_tokens"] == 4 * CHUNK
