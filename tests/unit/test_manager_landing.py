"""The scheduler's lookup of a prompt whose first chunk is on its way to SSD (its CPU slot was
taken before the write was reported): it answers "not yet" where the disk keeps up with
recompute, and recomputes at once where it does not."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from miniflex.config import MiniFlexConfig
from miniflex.keys import chunk_key
from miniflex.scheduler.lookup import LANDING_WAIT_S
from miniflex.scheduler.manager import MiniFlexManager
from miniflex.types import ReqId
from tests.unit.test_keys import NS as TEST_NS

NS = dataclasses.replace(TEST_NS, block_size=16, blocks_per_chunk=1)
CHUNKS = 4
HASHES = [bytes([i + 1]) * 32 for i in range(CHUNKS)]
KEYS = [chunk_key(NS, h) for h in HASHES]
TOKENS = CHUNKS * NS.chunk_tokens + 1


def landing_first_chunk(tmp_path: Path, **settings: object) -> tuple[MiniFlexManager, list]:
    """A 4-slot CPU tier holding the prompt, over an SSD tier; its first chunk's write-back
    was sent, then its slot taken by another store: the chunk is readable nowhere."""
    config = MiniFlexConfig(
        cpu_bytes=1 << 20,
        ssd_dirs=(str(tmp_path),),
        ssd_bytes=1 << 20,
        hit_policy="load",
        **settings,  # type: ignore[arg-type]
    )
    m = MiniFlexManager(config, NS, num_slots=CHUNKS, ssd_slots=16, chunk_bytes=4096)
    m.cost.observe_step(2048, 2048 * 1024.0, 1.0)  # recomputing a chunk: about 8 ms
    m.tiers.observe_writes(chunks=1, seconds=0.001)  # the disk keeps up
    m.tiers.complete_store(m.tiers.prepare_store(KEYS[:1]), ok=True)  # k0 before the rest
    m.tiers.complete_store(m.tiers.prepare_store(KEYS[1:-1]), ok=True)
    m.tiers.complete_store(m.tiers.prepare_store(KEYS[-1:]), ok=True)  # k0's write-back starts
    copies = m.tiers.take_demotions().copies
    assert [c.key for c in copies] == [KEYS[0]]
    other = chunk_key(NS, b"\xff" * 32)
    m.tiers.complete_store(m.tiers.prepare_store([other]), ok=True)  # takes k0's slot
    assert m.tiers.writeback.landing(KEYS[0])
    return m, copies


def test_a_lookup_waits_for_a_landing_chunk_where_the_disk_keeps_up(tmp_path: Path) -> None:
    m, copies = landing_first_chunk(tmp_path)
    assert m.lookup(ReqId("r"), HASHES, TOKENS, 0).tokens is None  # vLLM asks again next step
    m.tiers.complete_demotions(copies, failed=set())  # the write is reported: k0 is on SSD
    # from SSD, then CPU: as much as the CPU tier can stage at once (3 of its 4 slots)
    assert (
        m.lookup(ReqId("r"), HASHES, TOKENS, 0).tokens == m.tiers.max_load_chunks * NS.chunk_tokens
    )
    assert m.tiers.max_load_chunks == CHUNKS - 1


def test_a_lookup_does_not_wait_for_a_disk_slower_than_recompute(tmp_path: Path) -> None:
    m, _ = landing_first_chunk(tmp_path)
    m.tiers.observe_writes(chunks=1, seconds=1.0)  # now the disk writes a chunk in 0.3 s
    assert not m.tiers.disk_keeps_up
    assert m.lookup(ReqId("r"), HASHES, TOKENS, 0).tokens == 0  # recomputed, no wait


def test_a_lookup_waits_as_long_as_recomputing_the_rest_would_take(tmp_path: Path) -> None:
    """A sync that stalls on a busy disk: past LANDING_WAIT_S, the lookup keeps waiting only
    while the wait is still shorter than recomputing the rest of the prompt."""
    slow, _ = landing_first_chunk(tmp_path, prefill_tokens_per_s=10)  # 6.5 s of it
    assert slow.lookup(ReqId("r"), HASHES, TOKENS, 0).tokens is None
    slow.state_for(ReqId("r")).landing_since -= 2 * LANDING_WAIT_S  # a second has passed
    assert slow.lookup(ReqId("r"), HASHES, TOKENS, 0).tokens is None  # still cheaper than recompute
    slow.state_for(ReqId("r")).landing_since -= 10.0
    assert slow.lookup(ReqId("r"), HASHES, TOKENS, 0).tokens == 0  # longer than recompute: gave up
    fast, _ = landing_first_chunk(tmp_path)  # no prefill fit yet: LANDING_WAIT_S
    assert fast.lookup(ReqId("r"), HASHES, TOKENS, 0).tokens is None
    fast.state_for(ReqId("r")).landing_since -= 2 * LANDING_WAIT_S
    assert fast.lookup(ReqId("r"), HASHES, TOKENS, 0).tokens == 0
