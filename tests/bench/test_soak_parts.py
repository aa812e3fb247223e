"""The soak's parts that need no server: its fault injectors, prompt pool and round plan."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from miniflex.ssd import SSDStore, ThreadBackend
from miniflex.ssd.journal import RECORD_BYTES, SlotJournal
from miniflex.tools.bench.faults import corrupt_chunks, corrupt_journal
from miniflex.tools.bench.soak import SoakWorkload
from miniflex.tools.bench.soak_load import Outcome, PromptPool, mismatches
from miniflex.types import ChunkKey, SlotId
from tests.ssd.conftest import aligned, random_bytes

SLOT = 16 << 10
DIGEST = bytes(range(16))


def test_damaged_bytes_are_what_the_store_and_journal_then_report(direct_dir: Path) -> None:
    with ThreadBackend(4) as io, SSDStore([str(direct_dir)], 32 * SLOT, SLOT, DIGEST, io) as s:
        data = {k: random_bytes(SLOT, seed=k) for k in range(1, 21)}
        assert all(s.write([(ChunkKey(k), SlotId(k), memoryview(b)) for k, b in data.items()]))
    hit = set(corrupt_chunks(direct_dir, 5, seed=3))
    damaged = corrupt_journal(direct_dir, 0, seed=3)  # a torn tail only: the map survives
    assert len(hit) == 5 and damaged == 0
    with ThreadBackend(4) as io, SSDStore([str(direct_dir)], 32 * SLOT, SLOT, DIGEST, io) as s:
        bufs = {k: aligned(SLOT) for k in data}
        ok, _ = s.read([(ChunkKey(k), SlotId(k), memoryview(bufs[k])) for k in data])
        assert {k for k, good in zip(data, ok, strict=True) if not good} == hit
        assert all(np.array_equal(bufs[k], data[k]) for k in data if k not in hit)
    assert corrupt_journal(direct_dir, 3, seed=4) == 3
    j = SlotJournal(str(direct_dir / "miniflex-slots.journal"), DIGEST, SLOT, 32)
    assert (j.damaged_records, j.torn_bytes) == (3, RECORD_BYTES // 2)
    j.close()


def test_the_pool_shares_prefixes_and_rounds_cycle_through_the_faults() -> None:
    pool = PromptPool(vocab=2048, docs=4, variants=3, tokens=(64, 96), seed=1)
    assert len(pool) == 12 and all(64 <= len(p) <= 96 for p in pool.prompts)
    first, second = pool[0], pool[1]  # two variants of one document
    assert first[: len(first) * 3 // 4 - 1] == second[: len(first) * 3 // 4 - 1]
    assert pool[0][:8] != pool[3][:8]  # another document
    picks = [pool.pick(random.Random(i)) // 3 for i in range(400)]
    assert picks.count(0) > picks.count(3)  # the first document is the hottest
    soak = SoakWorkload(pool, requests=10, rounds=5, faults=("disk_full", "kill_corrupt"))
    assert [soak.round_fault(i) for i in range(5)] == [
        "none",
        "disk_full",
        "kill_corrupt",
        "disk_full",
        "kill_corrupt",
    ]
    ref = {0: (1, 2), 1: (3, 4)}
    done = [Outcome(0, False, (1, 2)), Outcome(1, False, (3, 5)), Outcome(1, True)]
    assert mismatches(done, ref) == 1
