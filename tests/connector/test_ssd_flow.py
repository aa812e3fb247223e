"""The SSD tier inside vLLM's real Scheduler: write-back, promotion, restart, corruption, reset.

The CPU tier holds 8 chunks here, so three 5-chunk prompts overflow it and the
first one ends up on SSD; the harness's stand-in model makes every page a
function of its prefix, so bytes served from SSD are checked bit for bit.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from vllm.v1.request import RequestStatus

from miniflex.keys import chunk_key
from miniflex.ssd.store import DATA_FILE, rank_dirs
from tests.connector.engine_config import tokens as prompt_tokens
from tests.connector.harness import BLOCK, Harness, make_harness
from tests.connector.stats_sum import prometheus_values
from tests.connector.stats_sum import totals as summed_totals

CHUNK = 2 * BLOCK
CHUNKS = 5
SLOT = 4096  # the harness's chunk: 2 layers x 2 blocks x 1 KiB pages


def tokens(seed: int, n: int = CHUNKS * CHUNK + 10) -> list[int]:
    return prompt_tokens(seed, n)


def harness(tmp_path: Path, ssd: Path, **extra: object) -> Harness:
    """Two chunks computed per step: write-back (at most 2 of the 8 CPU slots at once)
    keeps up, so no chunk the CPU tier evicts is dropped unwritten."""
    return make_harness(
        tmp_path / "model",
        cpu_bytes=str(8 * SLOT),
        max_batched=2 * CHUNK,
        extra={"ssd_dirs": str(ssd), "ssd_bytes": str(64 * SLOT), **extra},
    )


def totals(h: Harness) -> dict[str, float]:
    return summed_totals(h.kv_stats)


def serve_again(h: Harness, req_id: str, prompt: list[int]) -> int:
    """Serve ``prompt`` with vLLM's copy dropped; returns tokens MiniFlex loaded (checked)."""
    assert h.sched.reset_prefix_cache()
    return h.serve(req_id, prompt, steps=5)


def damage_slot(ssd: Path, slot: int) -> None:
    """Flip one byte of the chunk in ``slot`` of rank 0's store under ``ssd``."""
    path = os.path.join(rank_dirs([str(ssd)], 0)[0], DATA_FILE)
    with open(path, "r+b") as f:
        f.seek(slot * SLOT + 100)
        byte = f.read(1)
        f.seek(slot * SLOT + 100)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.fixture
def ssd(direct_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # Restarts must see the same block hashes: vLLM 0.26 seeds them randomly per
    # process (here: per harness) unless PYTHONHASHSEED is set.
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    return direct_dir


def test_chunks_evicted_from_cpu_are_served_from_ssd_bit_exact(tmp_path: Path, ssd: Path) -> None:
    h = harness(tmp_path, ssd)
    for i in range(3):
        h.cached_in_miniflex_only(f"w{i}", tokens(i))
    t = totals(h)
    assert t["demoted_chunks"] >= CHUNKS and t.get("ssd_write_failures", 0) == 0
    assert serve_again(h, "again", tokens(0)) == CHUNKS * CHUNK
    t = totals(h)
    assert t["hit_tokens_ssd"] == CHUNKS * CHUNK and t["promoted_chunks"] == CHUNKS
    assert t["ssd_read_bytes"] == CHUNKS * SLOT  # read back from disk, this rank's bytes
    value = prometheus_values(h.kv_stats, h.sched.vllm_config)  # and on /metrics:
    assert value("vllm:miniflex_tier_bytes_total", tier="ssd", op="read") == CHUNKS * SLOT
    assert value("vllm:miniflex_tier_bytes_total", tier="ssd", op="write") == t["demote_bytes"]
    loaded = value("vllm:miniflex_transfer_bytes_total", kind="load")  # one key, two metrics
    assert loaded and value("vllm:miniflex_tier_bytes_total", tier="cpu", op="read") == loaded
    assert any(key.startswith("ssd_jobs_") for key in t)  # the I/O backend is named
    assert h.manager_side.manager.cpu.usage().pinned_or_moving == 0
    h.worker.shutdown()


def test_ssd_hits_survive_a_restart(tmp_path: Path, ssd: Path) -> None:
    h = harness(tmp_path, ssd, ssd_write="through")
    h.cached_in_miniflex_only("a", tokens(1))
    h.run()  # write-through copies are queued after the store completes
    assert totals(h)["demoted_chunks"] == CHUNKS
    h.worker.shutdown()

    h2 = harness(tmp_path, ssd, ssd_write="through")
    assert h2.manager_side.manager.ssd is not None
    assert len(h2.manager_side.manager.ssd) == CHUNKS
    assert serve_again(h2, "b", tokens(1)) == CHUNKS * CHUNK
    assert totals(h2)["hit_tokens_ssd"] == CHUNKS * CHUNK
    h2.worker.shutdown()


def test_a_corrupt_chunk_on_ssd_is_recomputed_and_dropped(tmp_path: Path, ssd: Path) -> None:
    h = harness(tmp_path, ssd, ssd_write="through")
    h.cached_in_miniflex_only("a", tokens(2))
    h.run()
    h.worker.shutdown()
    damage_slot(ssd, 2)  # the third chunk (SSD slots are handed out in order)
    h2 = harness(tmp_path, ssd)
    loaded = serve_again(h2, "b", tokens(2))
    assert loaded == 2 * CHUNK  # recomputed from the chunk that failed its checksum on
    t = totals(h2)
    assert t["ssd_read_failures"] == 1
    assert len(h2.manager_side.manager.ssd or ()) == CHUNKS - 1  # dropped from the index
    h2.worker.shutdown()


def test_reset_forgets_ssd_chunks_durably(tmp_path: Path, ssd: Path) -> None:
    h = harness(tmp_path, ssd, ssd_write="through")
    h.cached_in_miniflex_only("a", tokens(3))
    h.run()
    assert h.sched.reset_prefix_cache(reset_connector=True)
    h.run()  # the CLEAR job goes out with the next plan
    h.worker.shutdown()
    h2 = harness(tmp_path, ssd)
    assert len(h2.manager_side.manager.ssd or ()) == 0
    h2.worker.shutdown()


def overflowed_to_ssd(tmp_path: Path, ssd: Path, **extra: object) -> Harness:
    """A harness whose first prompt, tokens(0), lives on SSD only."""
    h = harness(tmp_path, ssd, **extra)
    for i in range(3):
        h.cached_in_miniflex_only(f"w{i}", tokens(i))
    return h


@pytest.mark.parametrize(
    ("extra", "loaded", "recomputed_by_choice"),
    [
        ({"hit_policy": "load"}, CHUNKS * CHUNK, 0),
        ({"hit_policy": "cpu"}, 0, 0),
        # the cost model told that SSD is very slow and prefill very fast: recompute
        ({"ssd_read_gbps": 1e-6, "prefill_tokens_per_s": 1e9}, 0, CHUNKS),
        # ... and the other way round: load
        ({"ssd_read_gbps": 1e3, "prefill_tokens_per_s": 10}, CHUNKS * CHUNK, 0),
    ],
    ids=["load", "cpu-only", "cost-recompute", "cost-load"],
)
def test_hit_policy_decides_whether_ssd_chunks_are_loaded(
    tmp_path: Path, ssd: Path, extra: dict, loaded: int, recomputed_by_choice: int
) -> None:
    # The prompts reach SSD on a disk that pays off; the engine restarts with the settings
    # under test (a disk that slow would have admitted nothing: test_ssd_admission.py).
    overflowed_to_ssd(tmp_path, ssd).worker.shutdown()
    h = harness(tmp_path, ssd, **extra)
    assert serve_again(h, "again", tokens(0)) == loaded
    t = totals(h)
    assert t.get("hit_tokens_ssd", 0) == loaded
    assert t.get("ssd_chunks_recomputed", 0) == recomputed_by_choice
    h.worker.shutdown()


def test_workers_report_forward_times_to_the_cost_model(tmp_path: Path, ssd: Path) -> None:
    h = harness(tmp_path, ssd)
    h.cached_in_miniflex_only("a", tokens(5))
    assert h.manager_side.manager.cost.observed_steps >= 1
    h.worker.shutdown()


def small_cpu_tier(tmp_path: Path, ssd: Path, **extra: object) -> Harness:
    """A CPU tier of 5 slots, two of which write-back may hold: a load may hold 3 of them."""
    return make_harness(
        tmp_path / "model",
        cpu_bytes=str(5 * SLOT),
        max_batched=2 * CHUNK,  # 2 chunks a step: write-back keeps up, each prompt is all kept
        extra={
            "ssd_dirs": str(ssd),
            "ssd_bytes": str(64 * SLOT),
            "ssd_write_backlog": str(2 * SLOT),
            "hit_policy": "load",
            **extra,
        },
    )


def test_without_staging_an_ssd_hit_is_promised_only_as_far_as_the_cpu_tier_holds_it(
    tmp_path: Path, ssd: Path
) -> None:
    """``ssd_stream_bytes=0``: every chunk read from SSD is promoted into a CPU slot, so a
    5-chunk prompt on SSD loads 3 chunks, and vLLM is promised those 3 only (not 5, two of
    which would fail and count in vLLM's cached tokens while being recomputed)."""
    h = small_cpu_tier(tmp_path, ssd, ssd_stream_bytes="0")
    for i in range(3):
        h.cached_in_miniflex_only(f"w{i}", tokens(i))
    assert serve_again(h, "again", tokens(0)) == 3 * CHUNK
    assert h.cached_tokens["again"] == 3 * CHUNK
    params = h.params["again"]["miniflex"]
    assert params["hit_tokens"] == 3 * CHUNK
    assert params["resident_tokens_ssd"] == CHUNKS * CHUNK
    h.worker.shutdown()


@pytest.mark.parametrize("staging_slots", [2, 3, 64])
def test_an_ssd_hit_longer_than_the_cpu_tier_streams_through_the_staging_slots(
    tmp_path: Path, ssd: Path, staging_slots: int
) -> None:
    """9-chunk prompts over a CPU tier of 5 slots: a load promotes the 3 chunks the tier can
    spare and streams the other 6 through the staging slots (reused in turn: windows of 1
    chunk with 2 or 3 slots), and every byte vLLM is given is the model's own. Nothing stays
    pinned, and no staging slot stays held."""
    long = 9
    h = small_cpu_tier(tmp_path, ssd, ssd_stream_bytes=str(staging_slots * SLOT))
    for i in range(3):
        h.cached_in_miniflex_only(f"w{i}", tokens(i, long * CHUNK + 10))
    assert serve_again(h, "again", tokens(0, long * CHUNK + 10)) == long * CHUNK
    t = totals(h)
    assert t["hit_tokens_ssd"] == long * CHUNK
    assert (t["promoted_chunks"], t["streamed_chunks"]) == (3, long - 3)
    assert t["ssd_read_bytes"] == long * SLOT  # promoted and streamed alike
    manager = h.manager_side.manager
    assert manager.cpu.usage().pinned_or_moving == 0
    assert manager.ssd is not None and manager.ssd.usage().pinned_or_moving == 0
    assert h.worker.handler._reads.streamer._ring.idle()
    # the streamed chunks are not stored back into the CPU tier (they would push out the
    # promoted head): the next load finds the head there and streams the rest again
    stored = t.get("stored_tokens", 0)
    assert serve_again(h, "third", tokens(0, long * CHUNK + 10)) == long * CHUNK
    t2 = totals(h)
    assert t2.get("stored_tokens", 0) == stored
    assert t2.get("hit_tokens_cpu", 0) == 3 * CHUNK
    assert t2["streamed_chunks"] - t["streamed_chunks"] == long - 3
    h.worker.shutdown()


def test_a_corrupt_streamed_chunk_is_recomputed_after_a_restart(tmp_path: Path, ssd: Path) -> None:
    """After a restart, a 9-chunk prompt loads from SSD alone: 3 chunks promoted, the rest
    streamed through 2 staging slots. One streamed chunk's bytes were damaged on disk: the
    load stops there (vLLM recomputes from it on), and the staging slots and pins are all
    given back; the recomputed chunks are stored again and served whole next time."""
    long, bad = 9, 6
    prompt = tokens(0, long * CHUNK + 10)
    h = small_cpu_tier(tmp_path, ssd, ssd_stream_bytes=str(2 * SLOT))
    for i in range(3):
        h.cached_in_miniflex_only(f"w{i}", tokens(i, long * CHUNK + 10))
    manager = h.manager_side.manager
    hashes = h.requests["w0"].block_hashes
    key = chunk_key(manager.ns, bytes(hashes[(bad + 1) * CHUNK // BLOCK - 1]))
    slot = manager.ssd.slot_of(key) if manager.ssd is not None else None
    assert slot is not None
    h.worker.shutdown()
    with open(os.path.join(rank_dirs([str(ssd)], 0)[0], DATA_FILE), "r+b") as f:
        f.seek(slot * SLOT + 100)
        byte = f.read(1)
        f.seek(slot * SLOT + 100)
        f.write(bytes([byte[0] ^ 0xFF]))

    h2 = small_cpu_tier(tmp_path, ssd, ssd_stream_bytes=str(2 * SLOT))
    assert serve_again(h2, "again", prompt) == bad * CHUNK
    t = totals(h2)
    assert t["ssd_read_failures"] == 1
    assert h2.manager_side.manager.cpu.usage().pinned_or_moving == 0
    assert h2.worker.handler._reads.streamer._ring.idle()
    # the recomputed chunks were stored again: the next time, all of the prompt loads
    assert serve_again(h2, "third", prompt) == long * CHUNK
    assert totals(h2)["ssd_read_failures"] == 1
    h2.worker.shutdown()


def streaming_harness(tmp_path: Path, ssd: Path) -> tuple[Harness, list[int]]:
    """A harness whose first 9-chunk prompt (returned) lives on SSD only; a load of it
    promotes 3 chunks and streams 6 through 2 staging slots."""
    long = 9
    h = small_cpu_tier(tmp_path, ssd, ssd_stream_bytes=str(2 * SLOT))
    for i in range(3):
        h.cached_in_miniflex_only(f"w{i}", tokens(i, long * CHUNK + 10))
    return h, tokens(0, long * CHUNK + 10)


def nothing_held(h: Harness) -> bool:
    """No CPU or SSD slot pinned, no staging slot held, no job in flight."""
    manager = h.manager_side.manager
    return (
        manager.cpu.usage().pinned_or_moving == 0
        and manager.ssd is not None
        and manager.ssd.usage().pinned_or_moving == 0
        and h.worker.handler._reads.streamer._ring.idle()
        and not manager.has_jobs()
    )


def test_a_request_aborted_mid_stream_gives_every_slot_back(tmp_path: Path, ssd: Path) -> None:
    h, prompt = streaming_harness(tmp_path, ssd)
    total = h.free_blocks()
    assert h.sched.reset_prefix_cache()
    h.mover.gate.clear()  # the first part's copy hangs: later windows wait for its slots
    h.add("b", prompt)
    h.step(wait_transfers=False)
    h.sched.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    h.step(wait_transfers=False)
    assert not h.finished_and_freed("b")  # blocks stay until the load lets go of them
    h.mover.gate.set()
    h.run()
    assert h.finished_and_freed("b") and h.free_blocks() == total
    assert nothing_held(h)
    assert serve_again(h, "again", prompt) == len(prompt) // CHUNK * CHUNK
    h.worker.shutdown()


@pytest.mark.parametrize("fault", ["copy", "read"])
def test_a_streamed_load_that_fails_is_recomputed_and_holds_nothing(
    tmp_path: Path, ssd: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """A copy to vLLM's blocks that raises (the first part's), or an SSD read that raises
    (the second window's): the job fails and its blocks are load errors, nothing stays
    held, and the prompt loads whole again afterwards."""
    h, prompt = streaming_harness(tmp_path, ssd)
    if fault == "copy":
        h.mover.fail_loads = 1
    else:
        copier = h.worker.handler._ssd
        assert copier is not None
        reads = {"n": 0}
        real = copier.promote

        def promote(copies: list) -> tuple:
            reads["n"] += 1
            if reads["n"] == 3:  # the promotions, the first window, then this one
                raise OSError(5, "injected read failure")
            return real(copies)

        monkeypatch.setattr(copier, "promote", promote)
    serve_again(h, "b", prompt)  # whatever vLLM was given (it looks again) is checked
    assert totals(h)["failed_jobs"] == 1 and h.load_errors > 0
    assert nothing_held(h)
    monkeypatch.undo()
    assert serve_again(h, "again", prompt) == len(prompt) // CHUNK * CHUNK
    h.worker.shutdown()


def test_a_disk_slower_than_recompute_costs_the_cpu_tier_nothing(tmp_path: Path, ssd: Path) -> None:
    """Told that reading a chunk from SSD takes far longer than recomputing it, the SSD tier
    admits nothing but a probe write: the CPU tier serves exactly what it serves with no SSD
    tier at all (no slots kept for write-back, nothing written ahead)."""

    def cpu_hit_tokens(h: Harness) -> float:
        for i, seed in enumerate([0, 1, 0, 1, 0, 1, 2, 1, 2]):
            serve_again(h, f"r{i}", tokens(seed))
        return totals(h).get("hit_tokens_cpu", 0)

    slow = harness(tmp_path / "slow", ssd, ssd_read_gbps=1e-6, prefill_tokens_per_s=1e9)
    plain = make_harness(
        tmp_path / "plain" / "model",
        cpu_bytes=str(8 * SLOT),
        max_batched=2 * CHUNK,
        extra={"prefill_tokens_per_s": 1e9},
    )
    hits = cpu_hit_tokens(slow)
    assert hits == cpu_hit_tokens(plain) > 0
    t = totals(slow)
    assert t.get("demoted_chunks", 0) <= 1 and t.get("demotions_declined", 0) > 0
    slow.worker.shutdown()
