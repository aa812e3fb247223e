"""Tensor parallelism: one plan drives every rank, each rank moves its own shard, and a hit
is only the prefix that every rank holds, so the ranks never diverge.

Two workers, each with KV tensors of its own, run every plan; the stand-in
model writes different pages on each rank (each holds its own KV heads), and
vLLM's KVOutputAggregator merges their outputs as its executor does.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from miniflex.ssd.store import DATA_FILE, rank_dirs
from tests.connector.engine_config import tokens as prompt_tokens
from tests.connector.harness import BLOCK, Harness, make_harness
from tests.connector.stats_sum import totals as summed_totals

CHUNK = 2 * BLOCK
CHUNKS = 5
SLOT = 4096  # the harness's chunk on one rank: 2 layers x 2 blocks x 1 KiB pages


def tokens(seed: int, n: int = CHUNKS * CHUNK + 10) -> list[int]:
    return prompt_tokens(seed, n)


def totals(h: Harness) -> dict[str, float]:
    return summed_totals(h.kv_stats)


def serve_again(h: Harness, req_id: str, prompt: list[int]) -> int:
    """Serve ``prompt`` with vLLM's copy dropped; returns the tokens that were not computed,
    after checking that every rank's forward read its own bytes of them."""
    assert h.sched.reset_prefix_cache()
    return h.serve(req_id, prompt, steps=6, read=True)


def tp2(tmp_path: Path, **extra: object) -> Harness:
    return make_harness(tmp_path / "model", cpu_bytes=str(16 * SLOT), extra=extra, tp_size=2)


@pytest.fixture
def ssd(direct_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # restarts see the same block hashes
    return direct_dir


def ssd_tp2(tmp_path: Path, ssd: Path) -> Harness:
    return tp2(tmp_path, ssd_dirs=str(ssd), ssd_bytes=str(128 * SLOT), ssd_write="through")


def test_each_rank_loads_its_own_shard_and_a_hit_counts_once(tmp_path: Path) -> None:
    h = tp2(tmp_path)
    h.cached_in_miniflex_only("a", tokens(1))
    assert serve_again(h, "b", tokens(1)) == CHUNKS * CHUNK
    t = totals(h)
    assert t["hit_tokens_cpu"] == CHUNKS * CHUNK  # the engine's hit, not one per rank
    assert t["stored_tokens"] == CHUNKS * CHUNK
    assert t["failed_jobs"] == 0 and h.load_errors == 0
    h.shutdown()


def test_the_cpu_budget_is_the_engines_and_each_rank_pools_its_share(tmp_path: Path) -> None:
    h = tp2(tmp_path)
    assert h.manager_side.manager.cpu.num_slots == 8  # 16 slots' worth over two pools
    assert [r.worker.handler._pool.nbytes for r in h.ranks] == [8 * SLOT, 8 * SLOT]
    h.shutdown()


def test_a_store_that_fails_on_one_rank_is_a_miss_on_every_rank(tmp_path: Path) -> None:
    h = tp2(tmp_path)
    h.ranks[1].mover.fail_stores = 1
    h.cached_in_miniflex_only("a", tokens(2))
    assert totals(h)["failed_jobs"] == 1
    assert len(h.manager_side.manager.cpu) == 0  # rank 0's copy alone is never served
    assert serve_again(h, "b", tokens(2)) == 0
    assert serve_again(h, "c", tokens(2)) == CHUNKS * CHUNK  # stored by b, on both ranks
    h.shutdown()


def test_a_load_that_fails_on_one_rank_is_recomputed_on_every_rank(tmp_path: Path) -> None:
    h = tp2(tmp_path)
    h.cached_in_miniflex_only("a", tokens(3))
    h.ranks[1].mover.fail_loads = 1
    assert serve_again(h, "b", tokens(3)) == 0  # rank 0's load is thrown away too
    assert h.load_errors == CHUNKS * CHUNK // BLOCK  # rank 1's blocks, reported once
    assert totals(h).get("hit_tokens_cpu", 0) == 0
    assert serve_again(h, "c", tokens(3)) == CHUNKS * CHUNK  # stored again after recompute
    h.shutdown()


def test_a_chunk_corrupt_on_one_rank_is_recomputed_from_there_on_every_rank(
    tmp_path: Path, ssd: Path
) -> None:
    h = ssd_tp2(tmp_path, ssd)
    h.cached_in_miniflex_only("a", tokens(4))
    h.run()
    h.shutdown()
    path = Path(rank_dirs([str(ssd)], 1)[0]) / DATA_FILE
    with open(path, "r+b") as f:  # rank 1's third chunk (slots are handed out in order)
        f.seek(2 * SLOT + 100)
        byte = f.read(1)
        f.seek(2 * SLOT + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    h2 = ssd_tp2(tmp_path, ssd)
    assert serve_again(h2, "b", tokens(4)) == 2 * CHUNK
    assert totals(h2)["ssd_read_failures"] == 1
    assert serve_again(h2, "c", tokens(4)) == CHUNKS * CHUNK  # b stored what it recomputed
    h2.shutdown()


def test_after_a_restart_only_chunks_every_rank_recovered_are_served(
    tmp_path: Path, ssd: Path
) -> None:
    h = ssd_tp2(tmp_path, ssd)
    h.cached_in_miniflex_only("a", tokens(5))
    h.run()
    h.shutdown()
    rank1 = Path(rank_dirs([str(ssd)], 1)[0])
    shutil.copytree(rank1, tmp_path / "rank1-a-only")
    h = ssd_tp2(tmp_path, ssd)
    h.cached_in_miniflex_only("b", tokens(6))
    h.run()
    h.shutdown()
    shutil.rmtree(rank1)
    shutil.copytree(tmp_path / "rank1-a-only", rank1)  # rank 1 lost b's chunks

    h = ssd_tp2(tmp_path, ssd)
    assert len(h.manager_side.manager.ssd or ()) == CHUNKS  # a's; b's are on rank 0 only
    assert serve_again(h, "a2", tokens(5)) == CHUNKS * CHUNK
    assert serve_again(h, "b2", tokens(6)) == 0
    assert h.load_errors == 0
    h.shutdown()


def test_each_rank_reads_only_its_own_shard_from_ssd(tmp_path: Path, ssd: Path) -> None:
    """A rank's journal is tagged with its shard's namespace: swapped rank directories
    are found empty (and reset), never served to the other rank."""
    h = ssd_tp2(tmp_path, ssd)
    h.cached_in_miniflex_only("a", tokens(7))
    h.run()
    h.shutdown()
    rank0, rank1 = (Path(d) for d in (rank_dirs([str(ssd)], r)[0] for r in (0, 1)))
    rank0.rename(tmp_path / "swap")
    rank1.rename(rank0)
    (tmp_path / "swap").rename(rank1)
    h = ssd_tp2(tmp_path, ssd)
    assert len(h.manager_side.manager.ssd or ()) == 0
    assert serve_again(h, "b", tokens(7)) == 0
    h.shutdown()


def test_an_in_step_load_that_fails_on_one_rank_is_recomputed_on_every_rank(
    tmp_path: Path,
) -> None:
    h = make_harness(tmp_path / "model", cpu_bytes=str(16 * SLOT), load_mode="layerwise", tp_size=2)
    h.cached_in_miniflex_only("a", tokens(8))
    h.ranks[1].mover.fail_layerwise = True
    assert h.sched.reset_prefix_cache()
    h.add("b", tokens(8), max_tokens=2)
    h.run()
    assert h.load_errors > 0  # rank 1's, merged into the step's invalid blocks
    assert totals(h).get("hit_tokens_cpu", 0) == 0
    assert serve_again(h, "c", tokens(8)) == CHUNKS * CHUNK  # b's recompute, stored again
    h.shutdown()
