"""``bench.remote_share``'s summary: the ratios and speeds it derives from its rows."""

from __future__ import annotations

from bench.remote_share import summary, table

KV = 1000  # bytes per token


def row(cpu_tiers: dict[str, int], remote_ms: float = 500.0) -> dict[str, object]:
    return {
        "hit_policy": "load",
        "prompt_tokens": 4096,
        "recompute_ms": 1000.0,
        "remote_ms": remote_ms,
        "cpu_ms": 100.0,
        "remote_tiers": {"remote": 4000},
        "cpu_tiers": cpu_tiers,
    }


def test_the_fetch_speed_is_the_hit_over_its_time_beyond_a_cpu_hit() -> None:
    (s,) = summary([row({"cpu": 4000})], KV)
    assert s["recompute_over_remote"] == 2.0
    assert s["fetch_gbps"] == round(4000 * KV / 0.4 / 1e9, 2)
    assert s["hit_gbps"] == round(4000 * KV / 0.5 / 1e9, 2)


def test_without_a_whole_cpu_hit_there_is_no_fetch_speed_only_the_hit_speed() -> None:
    """A CPU tier smaller than the prompt: the second request came partly from the store,
    so time beyond it says nothing of the fetch."""
    (s,) = summary([row({"cpu": 1000, "remote": 3000})], KV)
    assert s["fetch_gbps"] is None and s["hit_gbps"] == round(4000 * KV / 0.5 / 1e9, 2)
    assert "| None | 0.01 |" in table({"summary": [s]})


def test_the_remote_requests_queue_and_the_holds_ended_meanwhile_are_summarised() -> None:
    """B's remote request waited for KV space while its previous request's blocks were held
    for its stores: the medians of both are in the summary and the table."""
    rows = [
        row({"cpu": 4000})
        | {"remote_load_s": {"queued": q}, "remote_blocks_held": {"requests": 1, "seconds": h}}
        for q, h in ((1.9, 2.0), (2.1, 2.2), (0.1, 0.2))
    ]
    (s,) = summary(rows, KV)
    assert s["remote_queued_s"] == 1.9 and s["remote_held_s"] == 2.0
    assert "| 1.9 | 2.0 |" in table({"summary": [s]})
    (old,) = summary([row({"cpu": 4000})], KV)  # rows from before these were recorded
    assert old["remote_queued_s"] is None and old["remote_held_s"] is None
