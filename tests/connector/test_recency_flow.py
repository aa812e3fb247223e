"""Which chunks the CPU tier keeps when prompts outgrow it, in vLLM's real Scheduler."""

from __future__ import annotations

from pathlib import Path

from miniflex.keys import chunk_key
from tests.connector.engine_config import tokens
from tests.connector.harness import BLOCK, Harness, make_harness

CHUNK = 2 * BLOCK
SLOT = 4096  # the harness's chunk: 2 layers x 2 blocks x 1 KiB pages


def resident(h: Harness, req_id: str) -> list[bool]:
    """Whether each chunk of a served request's prompt is in the CPU tier."""
    m = h.manager_side.manager
    req, bpc = h.requests[req_id], m.ns.blocks_per_chunk
    n = len(req.block_hashes) // bpc
    return [chunk_key(m.ns, bytes(req.block_hashes[(i + 1) * bpc - 1])) in m.cpu for i in range(n)]


def test_a_prompt_stored_over_several_steps_is_evicted_from_its_tail(tmp_path: Path) -> None:
    """Two chunks are computed (and stored) per step, so a prompt's head is stored first; a
    later prompt still takes the room from its tail, and its head keeps hitting."""
    h = make_harness(tmp_path / "model", cpu_bytes=str(8 * SLOT), max_batched=2 * CHUNK)
    h.cached_in_miniflex_only("a", tokens(0, 5 * CHUNK + 10))
    h.cached_in_miniflex_only("b", tokens(1, 5 * CHUNK + 10))
    assert resident(h, "a") == [True, True, True, False, False]
    assert resident(h, "b") == [True] * 5
    c = h.add("c", tokens(0, 5 * CHUNK + 10))
    assert h.manager_side.get_num_new_matched_tokens(c, 0)[0] == 3 * CHUNK


def test_a_request_waiting_for_kv_space_keeps_its_hit(tmp_path: Path) -> None:
    """vLLM looks a waiting request up again every step until it has KV space; each lookup
    counts as a use, so the stores of the requests running meanwhile take other chunks."""
    h = make_harness(tmp_path / "model", cpu_bytes=str(6 * SLOT))
    a = tokens(0, 3 * CHUNK + 10)
    h.cached_in_miniflex_only("a", a)
    h.cached_in_miniflex_only("b", tokens(1, 3 * CHUNK + 10))  # full: a is the oldest
    waiting = h.add("a-again", a, sched=False)
    assert h.manager_side.get_num_new_matched_tokens(waiting, 0)[0] == 3 * CHUNK
    h.cached_in_miniflex_only("c", tokens(2, 2 * CHUNK + 10))  # two slots: b's tail goes
    assert resident(h, "a") == [True] * 3
    assert resident(h, "b") == [True, False, False]
    assert h.manager_side.get_num_new_matched_tokens(waiting, 0)[0] == 3 * CHUNK


def test_chunks_of_generated_tokens_go_before_any_prompt(tmp_path: Path) -> None:
    """A request's output is stored too (a follow-up turn may repeat it), but at the cold
    end: a full tier gives it up before an older prompt."""
    h = make_harness(tmp_path / "model", cpu_bytes=str(7 * SLOT))
    h.cached_in_miniflex_only("b", tokens(1, 3 * CHUNK + 10))
    h.add("chat", tokens(0, 2 * CHUNK), max_tokens=2 * CHUNK + 4)  # 2 chunks out
    h.run()
    assert h.sched.reset_prefix_cache()
    assert resident(h, "chat") == [True] * 4 and resident(h, "b") == [True] * 3  # full
    h.cached_in_miniflex_only("c", tokens(2, 1 * CHUNK + 10))
    h.cached_in_miniflex_only("d", tokens(3, 1 * CHUNK + 10))
    assert resident(h, "chat") == [True, True, False, False]  # its output, not b, went
    assert resident(h, "b") == [True] * 3
