"""Tier-tagged KV events through vLLM's real Scheduler and its own event batches.

vLLM's scheduler publishes, after every step, its GPU cache's events and what the
connector's ``take_events`` returns. A reader of those batches alone must know, at
every step, which chunks MiniFlex's CPU and SSD tiers hold, with the block hashes
vLLM's own GPU events use for the same tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm.config.kv_events import KVEventsConfig
from vllm.distributed.kv_events import BlockRemoved, BlockStored
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

import tests.connector.harness as harness_module
from miniflex.connector.kv_events import medium_of
from miniflex.keys import chunk_key
from miniflex.types import Tier
from tests.connector.engine_config import tokens as prompt_tokens
from tests.connector.harness import BLOCK, Harness, make_harness

CHUNK = 2 * BLOCK
SLOT = 4096  # the harness's chunk: 2 layers x 2 blocks x 1 KiB pages
MEDIA = {medium_of(Tier.CPU): Tier.CPU, medium_of(Tier.SSD): Tier.SSD}


class Recorder:
    """Stands in for vLLM's publisher (ZMQ): keeps every batch the scheduler publishes."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def publish(self, batch: Any) -> None:
        self.events.extend(batch.events)

    def shutdown(self) -> None:
        pass


def with_events(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ssd: Path
) -> tuple[Harness, Recorder]:
    real = harness_module.make_vllm_config

    def config(*args: Any, **kwargs: Any) -> Any:
        vc = real(*args, **kwargs)
        vc.kv_events_config = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
        return vc

    monkeypatch.setattr(harness_module, "make_vllm_config", config)
    h = make_harness(
        tmp_path / "model",
        cpu_bytes=str(8 * SLOT),
        max_batched=2 * CHUNK,
        extra={"ssd_dirs": str(ssd), "ssd_bytes": str(64 * SLOT)},
    )
    h.sched.kv_event_publisher = recorder = Recorder()
    return h, recorder


def rebuild(events: list[Any]) -> dict[Tier, dict[tuple, list[int]]]:
    """Each MiniFlex tier's chunks (block hashes -> tokens), from the events alone."""
    out: dict[Tier, dict[tuple, list[int]]] = {Tier.CPU: {}, Tier.SSD: {}}
    for e in events:
        tier = MEDIA.get(e.medium) if isinstance(e, BlockStored | BlockRemoved) else None
        if tier is None:  # vLLM's own GPU events
            continue
        if isinstance(e, BlockStored):
            assert e.locality in (None, "LOCAL")
            out[tier][tuple(e.block_hashes)] = list(e.token_ids)
        else:
            del out[tier][tuple(e.block_hashes)]
    return out


def held(h: Harness, prompts: dict[str, list[int]]) -> dict[Tier, dict[tuple, list[int]]]:
    """What the tiers hold of ``prompts``, as vLLM would hash and announce its blocks."""
    conn = h.manager_side
    m, ns = conn.manager, conn.ns
    out: dict[Tier, dict[tuple, list[int]]] = {Tier.CPU: {}, Tier.SSD: {}}
    for req_id, toks in prompts.items():
        if req_id not in h.requests:  # not sent yet
            continue
        hashes = h.requests[req_id].block_hashes
        for i in range(len(toks) // CHUNK):
            chunk = tuple(maybe_convert_block_hash(x) for x in hashes[2 * i : 2 * i + 2])
            key = chunk_key(ns, bytes(hashes[2 * i + 1]))
            for tier in (m.cpu, m.ssd):
                if tier is not None and key in tier:
                    out[tier.tier][chunk] = toks[i * CHUNK : (i + 1) * CHUNK]
    return out


def test_events_alone_rebuild_the_cpu_and_ssd_tiers_at_every_step(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, direct_dir: Path
) -> None:
    h, recorder = with_events(monkeypatch, tmp_path, direct_dir)
    prompts = {f"w{i}": prompt_tokens(i, 5 * CHUNK + 10) for i in range(3)}
    for req_id, toks in prompts.items():
        h.add(req_id, toks)
        for _ in range(40):
            h.step()
            assert rebuild(recorder.events) == held(h, prompts)
            if not h.sched.requests and not h.manager_side.has_pending_push_work():
                break
        assert h.sched.reset_prefix_cache()  # vLLM's copy goes: the next one overflows
    tiers = rebuild(recorder.events)
    assert len(tiers[Tier.SSD]) >= 5 and tiers[Tier.CPU], "no overflow: the test proves nothing"

    # served again from the tiers: the promotions are announced too
    prompts["again"] = prompts["w0"]
    assert h.serve("again", prompts["again"], steps=5) == 5 * CHUNK
    h.run()
    assert rebuild(recorder.events) == held(h, prompts)
    # the hashes are those vLLM's own GPU events gave the same blocks
    gpu = {
        x
        for e in recorder.events
        if isinstance(e, BlockStored) and e.medium not in MEDIA
        for x in e.block_hashes
    }
    announced = {x for e in recorder.events if isinstance(e, BlockStored) for x in e.block_hashes}
    assert announced - gpu == set()

    assert h.sched.reset_prefix_cache(reset_connector=True)
    h.step()
    assert rebuild(recorder.events) == {Tier.CPU: {}, Tier.SSD: {}}
    h.worker.shutdown()


def test_a_hybrid_model_announces_its_full_attention_chunks_only(tmp_path: Path) -> None:
    """Under MiniFlexHMAConnector a sliding-window group keeps windows, not prefixes: a
    router is told of the full-attention group's chunks, every one of them."""
    from miniflex.connector import compat
    from tests.connector.test_groups_flow import Engine

    if compat.hma_base() is None:
        pytest.skip("this vLLM has no SupportsHMA")
    engine = Engine(
        tmp_path,
        max_batched=4 * CHUNK,
        events=KVEventsConfig(enable_kv_cache_events=True, publisher="null"),
    )
    engine.sched.kv_event_publisher = recorder = Recorder()
    engine.add("a", prompt_tokens(1, 10 * CHUNK + 5))
    engine.run()
    connector = engine.sched.connector
    window, full = (p.manager.cpu.usage().resident for p in connector.parts)
    assert (window, full) == (8, 10)  # the window group stored chunks too
    cpu = rebuild(recorder.events)[Tier.CPU]
    assert sorted(len(toks) for toks in cpu.values()) == [CHUNK] * full
    medium = medium_of(Tier.CPU)
    stored = [e for e in recorder.events if isinstance(e, BlockStored) and e.medium == medium]
    assert len(stored) == full  # announced once each, by one group
