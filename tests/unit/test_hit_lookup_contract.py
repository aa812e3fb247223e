"""HitLookup beyond the basic scenarios, on a real TierStack: where a hit ends, what a
rewritten prompt cuts back, how the load is timed, and chunks that only the SSD tier holds."""

from __future__ import annotations

from miniflex.config import MiniFlexConfig
from miniflex.cost import CostModel, PrefillFit
from miniflex.keys import Namespace, chunk_key
from miniflex.plan import LoadTiming
from miniflex.scheduler.advisor import HitAdvisor
from miniflex.scheduler.cuda_graphs import EAGER, GraphRule
from miniflex.scheduler.lookup import HitLookup
from miniflex.scheduler.requests import ReqState
from miniflex.tiers import TierStack
from miniflex.types import ChunkKey, ReqId, Tier

NS = Namespace("m", "bfloat16", "LBHNC", 2, 2, 64, block_size=16, blocks_per_chunk=2)
CT = NS.chunk_tokens  # 32
HASHES = [bytes([i + 1]) * 32 for i in range(10)]  # 10 blocks: 5 chunks, 160 tokens
KEYS = [chunk_key(NS, HASHES[2 * i + 1]) for i in range(5)]
FULL_GRAPHS = GraphRule(full_decode=True, full_mixed=True, decode_tokens=1, max_tokens=4096)


def lookup_over(stack: TierStack, graphs: GraphRule = EAGER, **config: object) -> HitLookup:
    cfg = MiniFlexConfig.from_dict(dict(config), env={})
    cost = CostModel(chunk_bytes=4096, chunk_tokens=CT)
    return HitLookup(NS, stack, HitAdvisor(cfg, cost), cost, graphs, cfg.load_mode)


def holding(*keys: ChunkKey, cpu_slots: int = 8) -> TierStack:
    stack = TierStack(cpu_slots=cpu_slots)
    for k in keys:
        stack.complete_store(stack.prepare_store([k]), ok=True)
    return stack


def test_the_hit_ends_at_the_first_chunk_no_tier_holds() -> None:
    hit = lookup_over(holding(KEYS[0], KEYS[1], KEYS[3])).find(ReqState(ReqId("r")), HASHES, 160, 0)
    assert hit.tokens == 2 * CT and dict(hit.resident_by_tier) == {"cpu": 2 * CT}


def test_nothing_is_loaded_where_vllms_own_hit_covers_the_resident_run() -> None:
    lookup = lookup_over(holding(*KEYS[:3]))
    assert lookup.find(ReqState(ReqId("r")), HASHES, 160, num_computed=3 * CT).tokens == 0


def test_a_prompt_of_one_stored_chunk_loads_all_but_its_last_block() -> None:
    lookup = lookup_over(holding(KEYS[0]))
    hit = lookup.find(ReqState(ReqId("r")), HASHES[:2], num_tokens=CT, num_computed=0)
    assert hit.tokens == CT - NS.block_size  # vLLM computes the last block's tokens itself


def test_a_rewritten_prompt_cuts_back_what_the_request_stored_and_has_due() -> None:
    lookup, st = lookup_over(holding()), ReqState(ReqId("r"))
    lookup.keys(st, HASHES)
    st.stored_chunks = st.store_due = 5
    tail = [bytes([0xF0 + i]) * 32 for i in range(6)]
    keys = lookup.keys(st, [*HASHES[:4], *tail])  # blocks 4.. replaced: chunk 2 on changed
    assert (st.stored_chunks, st.store_due) == (2, 2)
    assert keys[:2] == KEYS[:2] and len(keys) == 5 and len(st.keys.array) == 5
    lookup.keys(st, HASHES[:4])  # cut to the first two chunks
    assert list(st.keys) == KEYS[:2] and len(st.keys.array) == 2


def test_the_asked_load_mode_times_a_cpu_hit() -> None:
    for mode, timing in (
        ("sync", LoadTiming.SYNC),
        ("layerwise", LoadTiming.LAYERWISE),
        ("async", LoadTiming.ASYNC),
    ):
        lookup = lookup_over(holding(*KEYS[:3]), load_mode=mode)
        hit = lookup.find(ReqState(ReqId("r")), HASHES, 160, 0)
        assert (hit.tokens, hit.timing) == (3 * CT, timing), mode


def test_auto_never_loads_inside_a_step_that_may_replay_a_full_graph() -> None:
    eager = lookup_over(holding(*KEYS[:3]), load_mode="auto")
    assert eager.find(ReqState(ReqId("r")), HASHES, 160, 0).timing is LoadTiming.LAYERWISE
    graphs = lookup_over(holding(*KEYS[:3]), FULL_GRAPHS, load_mode="auto")
    hit = graphs.find(ReqState(ReqId("r")), HASHES, 160, 0)
    assert (hit.tokens, hit.timing) == (3 * CT, LoadTiming.ASYNC)  # the hooks may never come


def on_ssd_then_cpu() -> TierStack:
    """KEYS[0] only on SSD (evicted from CPU after its write-through), KEYS[1:3] in CPU."""
    stack = TierStack(cpu_slots=4, ssd_slots=16, write_through=True)
    others = [ChunkKey(0xAB00 + i) for i in range(4)]
    for k in [KEYS[0], *others, KEYS[1], KEYS[2]]:
        stack.complete_store(stack.prepare_store([k]), ok=True)
        batch = stack.take_demotions()
        stack.complete_demotions(batch.copies, failed=set())
    assert stack.residence(KEYS) == [Tier.SSD, Tier.CPU, Tier.CPU]
    return stack


def test_a_chunk_only_the_ssd_tier_holds_is_part_of_the_hit_and_loads_async() -> None:
    lookup = lookup_over(on_ssd_then_cpu(), load_mode="sync", hit_policy="load")
    hit = lookup.find(ReqState(ReqId("r")), HASHES, 160, 0)
    assert dict(hit.resident_by_tier) == {"ssd": CT, "cpu": 2 * CT}
    assert (hit.tokens, hit.timing) == (3 * CT, LoadTiming.ASYNC)  # no in-step SSD reads here
    assert hit.declined_tokens == 0


def test_what_the_cost_model_chooses_to_recompute_is_declined_not_hit() -> None:
    lookup = lookup_over(on_ssd_then_cpu())  # hit_policy=cost
    lookup.cost.prefill = PrefillFit(0.0, 1e-9, 0.0)  # recomputing is all but free
    lookup.cost.bandwidth[Tier.SSD] = 1e3  # and a read from SSD slow
    hit = lookup.find(ReqState(ReqId("r")), HASHES, 160, 0)
    assert hit.decision is not None and hit.decision.resident_chunks == 3
    assert hit.tokens == 0 and hit.declined_tokens == 3 * CT


def test_the_cpu_hit_policy_loads_only_the_leading_cpu_chunks() -> None:
    lookup = lookup_over(on_ssd_then_cpu(), hit_policy="cpu")
    hit = lookup.find(ReqState(ReqId("r")), HASHES, 160, 0)
    assert hit.tokens == 0 and dict(hit.resident_by_tier) == {"ssd": CT, "cpu": 2 * CT}
