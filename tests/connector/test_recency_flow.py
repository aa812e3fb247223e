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
