"""A hybrid model's two KV cache groups over an SSD tier, through vLLM's real Scheduler.

Each group has chunk keys of its own and an SSD store of its own (``<dir>/group<g>``);
a prompt whose CPU copies are gone from both groups is served from their SSD stores,
and the next forward reads every page of both groups bit for bit as computed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from miniflex.connector import compat
from miniflex.keys import chunk_key
from miniflex.ssd.store import DATA_FILE
from tests.connector.engine_config import tokens
from tests.connector.test_groups_flow import CHUNK, Engine, load_and_check

PROMPT = 10 * CHUNK + 5


def chunk_keys(part: object, request: object) -> list:
    """``part``'s key of each full chunk of ``request`` (the hash of its last block)."""
    hashes = request.block_hashes  # type: ignore[attr-defined]
    bpc = part.ns.blocks_per_chunk  # type: ignore[attr-defined]
    return [chunk_key(part.ns, bytes(h)) for h in hashes[bpc - 1 :: bpc]]  # type: ignore[attr-defined]


def needs_failed_recving() -> None:
    if compat.hma_base() is None:
        pytest.skip("this vLLM has no SupportsHMA")
    if compat.transfer_results_class() is None:
        pytest.skip("vLLM before 0.30 cannot be told a group's load failed: SSD is refused")


@pytest.fixture
def engine(tmp_path: Path, direct_dir: Path) -> Engine:
    needs_failed_recving()
    # 12 CPU slots of 4 KiB per group: two prompts do not fit; every chunk goes to SSD
    return Engine(
        tmp_path,
        max_batched=4 * CHUNK,
        cpu_bytes="96KiB",
        ssd_dirs=str(direct_dir),
        ssd_bytes="2MiB",
        ssd_write="through",
    )


def test_each_group_keys_its_chunks_apart_under_the_same_block_hashes(engine: Engine) -> None:
    parts = engine.sched.connector.parts
    assert parts[0].ns.kv_group != parts[1].ns.kv_group
    assert parts[0].ns.key_digest != parts[1].ns.key_digest
    a = engine.add("a", tokens(1, PROMPT))
    engine.run()
    window, full = (set(chunk_keys(p, a)) for p in parts)  # one prompt, two sets of keys
    assert len(window) == len(full) == 10 and not window & full
    sliding, whole = parts[0].manager, parts[1].manager
    assert all(k in whole.ssd for k in full)  # written through, every chunk
    assert any(k in sliding.ssd for k in window)  # its windows
    assert not any(k in sliding.ssd or k in sliding.cpu for k in full)


def test_both_groups_are_served_from_ssd_once_their_cpu_copies_are_gone(
    engine: Engine, direct_dir: Path
) -> None:
    a = engine.add("a", tokens(1, PROMPT))
    engine.run()
    parts = engine.sched.connector.parts
    keys = [chunk_keys(p, a) for p in parts]
    for i in range(3):  # fillers push a's chunks out of both CPU tiers
        engine.add(f"f{i}", tokens(10 + i, PROMPT))
        engine.run()
    for p, k in zip(parts, keys, strict=True):
        stored = [key for key in k if key in p.manager.ssd]
        assert stored and not any(key in p.manager.cpu for key in stored)
    for g in range(2):
        assert os.path.isfile(direct_dir / f"group{g}" / "rank0" / DATA_FILE)
    assert engine.sched.reset_prefix_cache()
    load_and_check(engine, a, "b", 10 * CHUNK)
    params = engine.params["b"]
    assert params["hit_tokens_ssd"] == 10 * CHUNK  # the main group's, all from SSD


def test_a_chunk_that_fails_its_read_costs_a_recompute_never_the_engine(
    engine: Engine, direct_dir: Path
) -> None:
    """Block ids are unique only within a group, so a failed load is reported by request
    (vLLM 0.30+; 0.31+ raises on block-level errors for several groups): vLLM recomputes."""
    a = engine.add("a", tokens(1, PROMPT))
    engine.run()
    for i in range(3):
        engine.add(f"f{i}", tokens(10 + i, PROMPT))
        engine.run()
    full = engine.sched.connector.parts[1]
    slot = full.manager.ssd.slot_of(chunk_keys(full, a)[3])
    assert slot is not None
    with open(direct_dir / "group1" / "rank0" / DATA_FILE, "r+b") as f:  # fails its checksum
        f.seek(slot * 4096 + 100)
        byte = f.read(1)
        f.seek(slot * 4096 + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert engine.sched.reset_prefix_cache()
    engine.add("b", list(a.prompt_token_ids))
    engine.run()  # the failed load is recomputed, and the engine goes on
    assert engine.params["b"]["hit_tokens"] < 10 * CHUNK
    read = {(g, b): page for (r, g, b), page in engine.read.items() if r == "b"}
    assert read and all(torch.equal(p, engine.page(a, b, g).half()) for (g, b), p in read.items())


def test_a_hit_the_main_group_cuts_short_ends_where_the_window_group_holds_a_window(
    tmp_path: Path, direct_dir: Path
) -> None:
    """The full-attention group leaves its SSD chunks to recompute (``hit_policy=cpu``) and
    loads 5 chunks; the window before token 160 needs chunk 4, which the window group never
    stored (no step ended there), so the hit is the longest shorter one it holds: 128."""
    needs_failed_recving()
    engine = Engine(
        tmp_path,
        max_batched=4 * CHUNK,  # steps end at chunks 4, 8 and 10: chunk 4 is in no window
        ssd_dirs=str(direct_dir),
        ssd_bytes="2MiB",
        ssd_write="through",
        hit_policy="cpu",
    )
    a = engine.add("a", tokens(1, PROMPT))
    engine.run()
    full = engine.sched.connector.parts[1].manager
    for key in chunk_keys(engine.sched.connector.parts[1], a)[5:]:
        assert key in full.ssd and full.cpu.drop(key)  # on SSD only: not loaded by choice
    assert engine.sched.reset_prefix_cache()
    load_and_check(engine, a, "b", 4 * CHUNK)
