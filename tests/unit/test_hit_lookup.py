"""HitLookup on a real TierStack: a request's keys, and the hit beyond vLLM's own."""

from __future__ import annotations

from miniflex.config import MiniFlexConfig
from miniflex.cost import CostModel
from miniflex.keys import Namespace, chunk_key
from miniflex.scheduler.advisor import HitAdvisor
from miniflex.scheduler.cuda_graphs import EAGER
from miniflex.scheduler.lookup import HitLookup, first_chunk_held
from miniflex.scheduler.requests import ReqState
from miniflex.tiers import TierStack
from miniflex.types import ReqId

NS = Namespace("m", "bfloat16", "LBHNC", 2, 2, 64, block_size=16, blocks_per_chunk=2)
CT = NS.chunk_tokens  # 32
HASHES = [bytes([i + 1]) * 32 for i in range(10)]  # 10 blocks: 5 chunks, 160 tokens
KEYS = [chunk_key(NS, HASHES[2 * i + 1]) for i in range(5)]


def lookup_over(stack: TierStack) -> HitLookup:
    cost = CostModel(chunk_bytes=4096, chunk_tokens=CT)
    return HitLookup(NS, stack, HitAdvisor(MiniFlexConfig(), cost), cost, EAGER, "async")


def stored(n: int, cpu_slots: int = 8) -> TierStack:
    stack = TierStack(cpu_slots=cpu_slots)
    stack.complete_store(stack.prepare_store(KEYS[:n]), ok=True)
    return stack


def test_a_request_is_keyed_by_the_last_block_hash_of_each_whole_chunk() -> None:
    lookup, st = lookup_over(stored(0)), ReqState(ReqId("r"))
    assert list(lookup.keys(st, HASHES[:7])) == KEYS[:3]  # a partial chunk has no key yet
    first = list(st.keys)
    assert list(lookup.keys(st, HASHES)) == KEYS  # extended as the prompt grows
    assert st.keys[:3] == first
    tail = [bytes([0xF0 + i]) * 32 for i in range(5)]  # vLLM replaced the prompt's tail from
    again = lookup.keys(st, [*HASHES[:5], *tail])  # block 5 on (hashes chain: all change)
    assert again[:2] == KEYS[:2]
    assert again[2:] == [chunk_key(NS, h) for h in tail[0::2]]


def test_the_hit_is_the_resident_run_after_vllms_own_up_to_the_last_block() -> None:
    lookup = lookup_over(stored(3))
    hit = lookup.find(ReqState(ReqId("a")), HASHES, num_tokens=160, num_computed=0)
    assert (hit.tokens, dict(hit.resident_by_tier)) == (3 * CT, {"cpu": 3 * CT})
    beyond = lookup.find(ReqState(ReqId("b")), HASHES, num_tokens=160, num_computed=CT)
    assert beyond.tokens == 2 * CT  # vLLM's GPU already holds the first chunk
    whole = lookup_over(stored(5)).find(ReqState(ReqId("c")), HASHES, 160, 0)
    assert whole.tokens == 160 - 16  # vLLM computes the last block (it must compute a token)


def test_a_lookup_pins_nothing_and_can_be_asked_again() -> None:
    stack = stored(3)
    lookup, st = lookup_over(stack), ReqState(ReqId("a"))
    first = lookup.find(st, HASHES, 160, 0)
    assert stack.cpu.usage().pinned_or_moving == 0
    assert lookup.find(st, HASHES, 160, 0) == first


def test_first_chunk_held_asks_one_key() -> None:
    assert first_chunk_held(NS, stored(1), False, HASHES)
    assert not first_chunk_held(NS, stored(0), False, HASHES)
    assert first_chunk_held(NS, stored(0), True, HASHES)  # a remote store may hold it
    assert not first_chunk_held(NS, stored(1), True, HASHES[:1])  # no whole chunk
