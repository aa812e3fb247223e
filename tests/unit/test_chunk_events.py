"""Tier changes as events: a reader that sees only the events rebuilds every tier exactly."""

from __future__ import annotations

import hashlib

import pytest

from miniflex.scheduler import chunk_events
from miniflex.scheduler.chunk_events import ChunkEvents, TierChange
from miniflex.tiers import TierStack
from miniflex.types import ChunkKey, SlotId, Tier
from tests.unit.test_tier_stack import demote_all, store

BPC, BS = 2, 4  # blocks per chunk, tokens per block


class Prompt:
    """A request's blocks, hashes chained like vLLM's, and its chunks' keys."""

    def __init__(self, seed: int, chunks: int) -> None:
        self.tokens = [(seed * 1000 + i) % 50_000 for i in range(chunks * BPC * BS)]
        self.hashes: list[bytes] = []
        prev = b"root"
        for b in range(chunks * BPC):
            prev = hashlib.sha256(prev + bytes(str(self.tokens[b * BS : (b + 1) * BS]), "ascii"))
            prev = prev.digest()
            self.hashes.append(prev)
        self.keys = [ChunkKey(int.from_bytes(h[:16], "big")) for h in self.hashes[BPC - 1 :: BPC]]

    def chunk_hashes(self, i: int) -> tuple[bytes, ...]:
        return tuple(self.hashes[i * BPC : (i + 1) * BPC])


def watched(stack: TierStack) -> ChunkEvents:
    events = ChunkEvents(BPC, BS)
    events.watch(stack.cpu)
    events.watch(stack.ssd)
    return events


def rebuild(changes: list[TierChange], into: dict[Tier, set] | None = None) -> dict[Tier, set]:
    """Each tier's chunks (their block hashes), from the events alone."""
    out = into if into is not None else {Tier.CPU: set(), Tier.SSD: set()}
    for c in changes:
        if c.stored:
            assert c.chunk.block_hashes not in out[c.tier], "stored twice in one tier"
            out[c.tier].add(c.chunk.block_hashes)
        else:
            out[c.tier].remove(c.chunk.block_hashes)  # only what was announced is removed
    return out


def truth(stack: TierStack, prompts: list[Prompt]) -> dict[Tier, set]:
    """Each tier's chunks as the tiers themselves hold them."""
    out: dict[Tier, set] = {Tier.CPU: set(), Tier.SSD: set()}
    for p in prompts:
        for i, key in enumerate(p.keys):
            for tier in (stack.cpu, stack.ssd):
                if tier is not None and key in tier:
                    out[tier.tier].add(p.chunk_hashes(i))
    return out


def test_stores_write_backs_promotions_and_drops_rebuild_every_tier() -> None:
    stack = TierStack(cpu_slots=4, ssd_slots=16, max_writeback=3)
    events = watched(stack)
    prompts = [Prompt(s, 3) for s in range(3)]
    seen = None
    for n, p in enumerate(prompts):
        events.describe(f"r{n}", p.keys, p.hashes, p.tokens, upto=3)
        store(stack, p.keys)
        demote_all(stack)  # the CPU tier's oldest chunks go to SSD, then leave CPU
        seen = rebuild(events.take(), seen)
        assert seen == truth(stack, prompts)
    assert seen[Tier.SSD], "nothing was written back: the test would prove nothing"

    # a load of the first prompt promotes its SSD chunks into CPU slots
    sources = stack.acquire(prompts[0].keys)
    read = [i for i, s in enumerate(sources) if s.ssd is not None]
    assert read, "nothing promoted: the test would prove nothing"
    bad = prompts[0].keys[read[-1]]
    stack.release(sources, ok=True, bad_keys={bad})  # one read was corrupt
    demote_all(stack)
    seen = rebuild(events.take(), seen)
    assert seen == truth(stack, prompts)
    assert all(prompts[0].chunk_hashes(read[-1]) not in held for held in seen.values())

    stack.clear()
    assert rebuild(events.take(), seen) == {Tier.CPU: set(), Tier.SSD: set()}
    assert events.chunks_held == 0


def test_a_stored_chunk_carries_its_tokens_parent_and_lora() -> None:
    stack = TierStack(cpu_slots=4)
    events = watched(stack)
    p = Prompt(7, 2)
    events.describe("r", p.keys, p.hashes, p.tokens, upto=2, lora=(3, "adapter"))
    store(stack, p.keys)
    second, first = events.take()  # published as a prefix is touched: its head last
    assert first.stored and first.tier is Tier.CPU
    assert first.chunk.parent is None and second.chunk.parent == p.hashes[BPC - 1]
    assert second.chunk.token_ids.tolist() == p.tokens[BPC * BS :]
    assert second.chunk.block_size == BS
    assert (second.chunk.lora_id, second.chunk.lora_name) == (3, "adapter")


def test_a_chunk_no_request_described_is_named_by_its_key_and_removed_by_it() -> None:
    stack = TierStack(cpu_slots=2, ssd_slots=4)
    events = watched(stack)
    p = Prompt(1, 2)
    assert stack.ssd is not None
    stack.ssd.seed({p.keys[0]: SlotId(0), p.keys[1]: SlotId(1)})  # recovered at start-up
    (a, b) = events.take()
    assert a.chunk.placeholder and a.chunk.block_hashes == (p.keys[0].to_bytes(16, "big"),)
    assert a.chunk.token_ids.size == 0
    # a request describes the chunks and promotes them: the CPU copy is announced in full,
    # the SSD copy keeps the name it was announced with
    events.describe("r", p.keys, p.hashes, p.tokens, upto=2)
    stack.release(stack.acquire(p.keys), ok=True, bad_keys=set())
    promoted = events.take()
    assert [c.chunk.block_hashes for c in promoted] == [p.chunk_hashes(1), p.chunk_hashes(0)]
    stack.clear()
    removed = {(c.tier, c.chunk.block_hashes) for c in events.take()}
    assert (Tier.SSD, a.chunk.block_hashes) in removed
    assert (Tier.SSD, b.chunk.block_hashes) in removed
    assert (Tier.CPU, p.chunk_hashes(0)) in removed


def test_descriptions_are_bounded_and_each_chunk_is_described_once_per_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(chunk_events, "PENDING_CHUNKS", 4)
    stack = TierStack(cpu_slots=8)
    events = watched(stack)
    old, new = Prompt(1, 2), Prompt(2, 4)
    events.describe("old", old.keys, old.hashes, old.tokens, upto=2)
    events.describe("new", new.keys, new.hashes, new.tokens, upto=4)  # pushes "old" out
    store(stack, old.keys)
    assert all(c.chunk.placeholder for c in events.take())
    store(stack, new.keys[:2])
    assert not any(c.chunk.placeholder for c in events.take())
    events.describe("new", new.keys, new.hashes, new.tokens, upto=4)  # already described
    store(stack, new.keys[2:])
    assert [c.chunk.block_hashes for c in events.take()] == [
        new.chunk_hashes(3),
        new.chunk_hashes(2),
    ]


def test_a_chunk_that_leaves_cpu_before_its_write_back_lands_keeps_its_description() -> None:
    stack = TierStack(cpu_slots=2, ssd_slots=8, max_writeback=1)
    events = watched(stack)
    p = Prompt(3, 3)
    events.describe("r", p.keys, p.hashes, p.tokens, upto=3)
    store(stack, p.keys[:1])
    store(stack, p.keys[1:2])  # the CPU tier is full: the older chunk starts its write-back
    copies = stack.take_demotions().copies
    assert [c.key for c in copies] == [p.keys[0]]
    store(stack, p.keys[2:])  # takes the slot of the chunk being written (reclaim)
    assert p.keys[0] not in stack.cpu, "the slot was not reclaimed: the test proves nothing"
    stack.complete_demotions(copies, failed=set())
    assert p.keys[0] in stack.ssd
    changes = events.take()
    landed = [c for c in changes if c.stored and c.tier is Tier.SSD]
    assert [c.chunk.block_hashes for c in landed] == [p.chunk_hashes(0)]
    assert rebuild(changes) == truth(stack, [p])
