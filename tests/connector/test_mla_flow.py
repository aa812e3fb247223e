"""MLA: the latent cache (one KV head) is the same on every TP rank, so rank 0 alone writes
it, into one pool that every rank maps, and every rank loads it from there.

The stand-in model writes the same latent pages on both ranks, as vLLM's
replicated ``kv_a_proj_with_mqa`` does; each rank's forward must read them bit
for bit, whether they come from the shared CPU pool or from rank 0's SSD store
(whose reads the other rank waits for through the pool's ledger).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from miniflex.ssd.store import DATA_FILE, rank_dirs
from tests.connector.engine_config import tokens as prompt_tokens
from tests.connector.harness import BLOCK, LAYERS, Harness, make_harness
from tests.connector.stats_sum import totals as summed_totals

CHUNK = 2 * BLOCK
CHUNKS = 5
SLOT = 4096  # 2 layers x 2 blocks x (16 tokens x 32 values x 2 bytes)


def tokens(seed: int, n: int = CHUNKS * CHUNK + 10) -> list[int]:
    return prompt_tokens(seed, n)


def totals(h: Harness) -> dict[str, float]:
    return summed_totals(h.kv_stats)


def serve_again(h: Harness, req_id: str, prompt: list[int]) -> int:
    """Serve ``prompt`` with vLLM's copy dropped; returns the tokens not computed, after
    checking every rank's forward read the right latent pages."""
    assert h.sched.reset_prefix_cache()
    return h.serve(req_id, prompt, steps=6, read=True)


def mla(tmp_path: Path, tp: int, **extra: object) -> Harness:
    return make_harness(
        tmp_path / "model", cpu_bytes=str(16 * SLOT), extra=extra, tp_size=tp, mla=True
    )


@pytest.fixture
def ssd(direct_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    return direct_dir


def test_mla_latent_pages_are_stored_and_loaded_bit_exact(tmp_path: Path) -> None:
    h = mla(tmp_path, tp=1)
    assert h.worker.geometry.latent and h.worker.geometry.page_bytes == BLOCK * 32 * 2
    h.cached_in_miniflex_only("a", tokens(1))
    assert serve_again(h, "b", tokens(1)) == CHUNKS * CHUNK
    h.shutdown()


def test_under_tp_rank_0_writes_one_shared_pool_and_every_rank_loads_it(
    tmp_path: Path,
) -> None:
    h = mla(tmp_path, tp=2)
    assert h.manager_side.manager.cpu.num_slots == 16  # one pool: the engine's whole budget
    h.cached_in_miniflex_only("a", tokens(2))
    assert h.ranks[0].mover.calls["store"] > 0 and h.ranks[1].mover.calls["store"] == 0
    pools = [r.worker.handler._pool for r in h.ranks]
    pools[0].array[15, :8] = 7  # one mapping: a byte rank 0 writes is in rank 1's view
    assert (pools[1].array[15, :8] == 7).all()
    assert serve_again(h, "b", tokens(2)) == CHUNKS * CHUNK
    assert h.ranks[1].mover.calls["load"] > 0
    assert totals(h)["hit_tokens_cpu"] == CHUNKS * CHUNK
    h.shutdown()
    assert not list(Path(pools[0].path).parent.glob(f"{Path(pools[0].path).name}*"))


def test_a_store_that_fails_on_the_writing_rank_is_a_miss_for_every_rank(tmp_path: Path) -> None:
    h = mla(tmp_path, tp=2)
    h.ranks[0].mover.fail_stores = 1
    h.cached_in_miniflex_only("a", tokens(3))
    assert len(h.manager_side.manager.cpu) == 0
    assert serve_again(h, "b", tokens(3)) == 0
    h.shutdown()


def test_rank_1_waits_for_rank_0s_ssd_reads_and_a_bad_one_is_recomputed_on_both(
    tmp_path: Path, ssd: Path
) -> None:
    extra = {"ssd_dirs": str(ssd), "ssd_bytes": str(64 * SLOT), "ssd_write": "through"}
    h = mla(tmp_path, tp=2, **extra)
    h.cached_in_miniflex_only("a", tokens(4))
    h.run()
    h.shutdown()
    assert not (ssd / "rank1").exists()  # one store: rank 0's
    path = Path(rank_dirs([str(ssd)], 0)[0]) / DATA_FILE
    with open(path, "r+b") as f:  # the third chunk (slots are handed out in order)
        f.seek(2 * SLOT + 100)
        byte = f.read(1)
        f.seek(2 * SLOT + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    h2 = mla(tmp_path, tp=2, **extra)
    assert len(h2.manager_side.manager.ssd or ()) == CHUNKS
    assert serve_again(h2, "b", tokens(4)) == 2 * CHUNK  # from SSD up to the bad chunk
    t = totals(h2)
    assert t["hit_tokens_ssd"] == 2 * CHUNK and t["ssd_read_failures"] == 1
    assert h2.load_errors == 2 * 2  # the bad chunk's two blocks, on each rank
    h2.shutdown()


def test_layers_of_a_latent_page_are_one_head(tmp_path: Path) -> None:
    h = mla(tmp_path, tp=1)
    assert [tuple(t.shape[1:]) for t in h.kv.values()] == [(1, BLOCK, 32)] * LAYERS
    h.shutdown()
