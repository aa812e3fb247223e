"""The cost model: which resident chunks to load, and its calibration from observations."""

from __future__ import annotations

import numpy as np
import pytest

from miniflex.config import MiniFlexConfig
from miniflex.cost import CostModel, PrefillFit, make_cost_model
from miniflex.types import Tier

CHUNK_BYTES, CHUNK_TOKENS = 64 << 20, 64
CPU, SSD = Tier.CPU, Tier.SSD


def model(cpu_gbps: float, ssd_gbps: float, per_token: float, per_pair: float = 0.0) -> CostModel:
    return CostModel(
        CHUNK_BYTES,
        CHUNK_TOKENS,
        {CPU: cpu_gbps * 1e9, SSD: ssd_gbps * 1e9},
        prefill=PrefillFit(0.001, per_token, per_pair),
    )


def test_uncalibrated_model_loads_everything_resident() -> None:
    m = CostModel(CHUNK_BYTES, CHUNK_TOKENS)
    d = m.choose([CPU, SSD, SSD], prompt_tokens=1000, gpu_hit=0)
    assert (d.load_chunks, d.calibrated) == (3, False)


def test_before_a_fit_slow_chunks_are_priced_by_the_prefill_steps_seen() -> None:
    # 64 MiB chunks: 67 ms to read at 1 GB/s, 1.3 ms at 50 GB/s (and 1.3 ms to copy)
    m = CostModel(CHUNK_BYTES, CHUNK_TOKENS, {CPU: 50e9, SSD: 1e9, Tier.REMOTE: 50e9})
    tiers = [CPU, SSD, SSD]
    assert m.choose(tiers, prompt_tokens=1000, gpu_hit=0).load_chunks == 3  # nothing seen yet
    m.observe_step(2048, 2048 * 1024.0, 0.2048)  # one prefill step: 0.1 ms a token
    assert not m.calibrated
    d = m.choose(tiers, prompt_tokens=4 * CHUNK_TOKENS, gpu_hit=0)
    assert d.load_chunks == 1 and not d.calibrated  # 6.4 ms of recompute beats 67 ms reads
    fast = m.choose([CPU, Tier.REMOTE], prompt_tokens=2 * CHUNK_TOKENS + 1000, gpu_hit=0)
    assert fast.load_chunks == 2  # 2.7 ms to fetch and copy 64 tokens that cost 6.4 ms
    slow_gpu = CostModel(CHUNK_BYTES, CHUNK_TOKENS, {CPU: 50e9, Tier.REMOTE: 10e9})
    slow_gpu.observe_step(2048, 2048 * 1024.0, 2.048)  # 1 ms a token: fetching pays
    assert slow_gpu.choose([Tier.REMOTE] * 4, 5 * CHUNK_TOKENS, 0).load_chunks == 4
    # a hit wholly in CPU is still loaded whole, layerwise when alone
    d = m.choose([CPU, CPU], 1000, 0, overlap=True)
    assert d.load_chunks == 2 and d.layerwise


def test_slow_ssd_is_recomputed_but_cpu_chunks_are_always_taken() -> None:
    # 64 MiB per chunk at 1 GB/s = 67 ms to read; 64 tokens cost 64 us to recompute
    m = model(cpu_gbps=50, ssd_gbps=1, per_token=1e-6)
    d = m.choose([CPU, CPU, SSD, SSD], prompt_tokens=10 * CHUNK_TOKENS, gpu_hit=0)
    assert d.load_chunks == 2
    assert d.predicted_s < d.load_all_s
    # even if recomputing the CPU chunks were cheaper, they are loaded
    assert m.choose([CPU, CPU], prompt_tokens=1000, gpu_hit=0).load_chunks == 2


def test_fast_ssd_is_loaded_when_recompute_costs_more() -> None:
    m = model(cpu_gbps=50, ssd_gbps=10, per_token=1e-3)  # 64 ms to recompute a chunk
    d = m.choose([SSD, SSD, CPU], prompt_tokens=4 * CHUNK_TOKENS, gpu_hit=0)
    assert d.load_chunks == 3 and d.predicted_s < d.recompute_s


def test_a_hit_of_the_whole_prompt_still_pays_for_computing_its_last_token() -> None:
    # every chunk resident, the last one ending at the prompt's end: vLLM computes the last
    # token whatever is loaded, so no choice is predicted to skip the prefill altogether
    m = model(cpu_gbps=50, ssd_gbps=10, per_token=1e-3)
    prompt = 4 * CHUNK_TOKENS
    d = m.choose([SSD] * 4, prompt_tokens=prompt, gpu_hit=0)
    last_token = m.prefill.seconds(1, prompt - 1)
    assert d.load_chunks == 4
    assert d.load_all_s == pytest.approx(m.load_seconds([SSD] * 4) + last_token)
    lw = m.choose([SSD] * 4, prompt_tokens=prompt, gpu_hit=0, overlap=True, instep=4)
    assert lw.predicted_s >= last_token
    # a hit ends at a whole block: with 16-token blocks the last block's tokens compute
    m.block_size = 16
    d = m.choose([SSD] * 4, prompt_tokens=prompt, gpu_hit=0)
    assert d.load_all_s == pytest.approx(m.load_seconds([SSD] * 4) + m.prefill.seconds(16, 240))


def test_attention_term_makes_a_long_prefix_worth_loading() -> None:
    # a Qwen3-8B-sized chunk (64 tokens x 144 KiB) read at 2 GB/s: about 5 ms each.
    # Recomputing a short prefix is cheaper; for a long one the attention term wins.
    def decide(chunks: int) -> int:
        m = CostModel(
            64 * 144 << 10,
            CHUNK_TOKENS,
            {CPU: 50e9, SSD: 2e9},
            prefill=PrefillFit(0.001, 1e-5, 1e-8),
        )
        return m.choose([SSD] * chunks, chunks * CHUNK_TOKENS + 1, 0).load_chunks

    assert decide(4) == 0
    assert decide(400) == 400


def test_prefill_fit_recovers_the_engine_coefficients() -> None:
    m = CostModel(CHUNK_BYTES, CHUNK_TOKENS)
    rng = np.random.default_rng(0)
    truth = PrefillFit(0.002, 30e-6, 2e-10)
    for _ in range(64):
        n, ctx = int(rng.integers(256, 8192)), int(rng.integers(0, 30000))
        pairs = n * (ctx + n / 2)
        m.observe_step(n, pairs, truth.seconds(n, ctx) * (1 + rng.normal(0, 0.01)))
    assert m.prefill is not None
    assert m.prefill.per_token == pytest.approx(truth.per_token, rel=0.1)
    assert m.prefill.per_pair == pytest.approx(truth.per_pair, rel=0.1)


def test_a_chunk_recompute_estimate_exists_from_the_first_prefill_step() -> None:
    m = CostModel(CHUNK_BYTES, CHUNK_TOKENS)
    m.observe_step(4, 4 * 1000.0, 0.01)  # decode steps say nothing about prefill
    assert m.chunk_recompute_seconds() is None
    m.observe_step(2048, 2048 * 1024.0, 1.024)  # 0.5 ms a token
    assert m.chunk_recompute_seconds() == pytest.approx(0.5e-3 * CHUNK_TOKENS)
    m.prefill = PrefillFit(0.002, 30e-6, 2e-10)  # once fitted: the fit's per-token term
    assert m.chunk_recompute_seconds() == pytest.approx(30e-6 * CHUNK_TOKENS)


def test_decode_only_steps_do_not_calibrate() -> None:
    m = CostModel(CHUNK_BYTES, CHUNK_TOKENS)
    for _ in range(100):
        m.observe_step(4, 4 * 1000.0, 0.01)
    assert not m.calibrated


def test_load_bandwidth_follows_observations_unless_fixed() -> None:
    m = CostModel(CHUNK_BYTES, CHUNK_TOKENS, {CPU: 10e9}, fixed_bandwidth=frozenset({SSD}))
    for _ in range(30):
        m.observe_load(CPU, 1 << 30, (1 << 30) / 40e9)
        m.observe_load(SSD, 1 << 30, 1.0)
    assert m.bandwidth[CPU] == pytest.approx(40e9, rel=0.01)
    assert m.bandwidth[SSD] == 1e9  # the default, kept


def test_config_overrides_fix_the_model() -> None:
    cfg = MiniFlexConfig.from_dict(
        {
            "cpu_load_gbps": 20,
            "ssd_read_gbps": "0.5",
            "remote_read_gbps": 2,
            "prefill_tokens_per_s": 10000,
        },
        env={},
    )
    m = make_cost_model(cfg, CHUNK_BYTES, CHUNK_TOKENS)
    assert m.bandwidth == {CPU: 20e9, SSD: 0.5e9, Tier.REMOTE: 2e9}
    assert m.prefill == PrefillFit(0.0, 1e-4, 0.0)
    m.observe_load(CPU, 1 << 30, 1.0)
    m.observe_step(1000, 1e6, 5.0)
    assert m.bandwidth[CPU] == 20e9 and m.prefill == PrefillFit(0.0, 1e-4, 0.0)


# ---- layerwise (load_mode=auto) ----
def layered(cpu_gbps: float, per_token: float, layers: int = 32) -> CostModel:
    return CostModel(
        CHUNK_BYTES,
        CHUNK_TOKENS,
        {CPU: cpu_gbps * 1e9, SSD: 1e9},
        prefill=PrefillFit(0.0, per_token, 0.0),
        num_layers=layers,
    )


def test_layerwise_hides_a_cpu_load_behind_the_prefill_of_the_suffix() -> None:
    # 10 chunks of 64 MiB at 50 GB/s: 13.4 ms of copies; 1000 new tokens: 100 ms of prefill
    m = layered(cpu_gbps=50, per_token=1e-4)
    d = m.choose([CPU] * 10, prompt_tokens=10 * CHUNK_TOKENS + 1000, gpu_hit=0, overlap=True)
    load = 10 * CHUNK_BYTES / 50e9
    assert d.layerwise and d.load_chunks == 10
    assert d.predicted_s == pytest.approx(0.1 + load / 32)  # max(load, prefill) + a layer
    assert d.async_s == pytest.approx(load + 0.1)  # load, then prefill (no step seen yet)
    assert d.predicted_s < d.async_s


def test_a_load_much_longer_than_the_suffix_prefill_stays_async() -> None:
    # one layer's copy (10 chunks at 0.1 GB/s over 2 layers: 3.4 s) dwarfs 1 token of prefill
    m = layered(cpu_gbps=0.1, per_token=1e-6, layers=2)
    d = m.choose([CPU] * 10, prompt_tokens=10 * CHUNK_TOKENS + 1, gpu_hit=0, overlap=True)
    assert not d.layerwise and d.predicted_s == d.async_s


def test_async_pays_one_engine_step_as_observed() -> None:
    m = layered(cpu_gbps=50, per_token=1e-4)
    m.observe_step(10, 0.0, 0.5)  # the engine's steps take 0.5 s now
    d = m.choose([CPU] * 2, prompt_tokens=2 * CHUNK_TOKENS + 10, gpu_hit=0, overlap=True)
    assert d.async_s == pytest.approx(2 * CHUNK_BYTES / 50e9 + 10e-4 + 0.5)
    assert d.layerwise


def test_a_slow_layerwise_path_sends_a_whole_hit_async_but_keeps_a_partial_one() -> None:
    # Whole-slot copies at 50 GB/s, but layer-by-layer copies were seen at 20 GB/s.
    m = layered(cpu_gbps=50, per_token=1e-4)
    m.observe_step(10, 0.0, 0.01)  # 10 ms engine steps
    m.observe_layerwise(1 << 30, (1 << 30) / 20e9)
    assert m.layerwise_bandwidth == pytest.approx(20e9)
    assert m.bandwidth[CPU] == pytest.approx(50e9)  # the async estimate is left alone
    # 60 chunks and one new token: 201 ms layerwise against 81 + 10 ms async
    whole = m.choose([CPU] * 60, prompt_tokens=60 * CHUNK_TOKENS + 1, gpu_hit=0, overlap=True)
    assert not whole.layerwise
    # 10 chunks before 4000 new tokens: the 400 ms prefill hides even the slow copy
    part = m.choose([CPU] * 10, prompt_tokens=10 * CHUNK_TOKENS + 4000, gpu_hit=0, overlap=True)
    assert part.layerwise and part.predicted_s < part.async_s


def test_a_layerwise_load_that_would_stall_running_requests_goes_async() -> None:
    # 40 chunks at 50 GB/s: 54 ms of copies under 64 new tokens (6.4 ms of prefill); 10 ms steps
    m = layered(cpu_gbps=50, per_token=1e-4)
    m.observe_step(10, 0.0, 0.01)
    prompt = 40 * CHUNK_TOKENS + 64
    alone = m.choose([CPU] * 40, prompt_tokens=prompt, gpu_hit=0, overlap=True)
    assert alone.layerwise  # 56 ms in the step beats 54 + 6 + 10 ms async
    busy = m.choose([CPU] * 40, prompt_tokens=prompt, gpu_hit=0, overlap=True, others=2)
    assert not busy.layerwise and busy.load_chunks == 40  # two requests would wait ~50 ms each
    # a prefill long enough to hide the copy stalls nobody: still layerwise
    long = m.choose([CPU] * 4, prompt_tokens=4 * CHUNK_TOKENS + 2000, gpu_hit=0, overlap=True)
    assert long.layerwise
    assert m.choose(
        [CPU] * 4, prompt_tokens=4 * CHUNK_TOKENS + 2000, gpu_hit=0, overlap=True, others=8
    ).layerwise
    # uncalibrated: layerwise only when nothing else runs
    raw = CostModel(CHUNK_BYTES, CHUNK_TOKENS, num_layers=4)
    assert raw.choose([CPU, CPU], 1000, 0, overlap=True).layerwise
    assert not raw.choose([CPU, CPU], 1000, 0, overlap=True, others=1).layerwise


def test_only_the_cpu_prefix_may_go_layerwise_and_ssd_chunks_then_recompute() -> None:
    # Reading the SSD chunks costs 67 ms each: the CPU prefix layerwise, the rest recomputed.
    m = layered(cpu_gbps=50, per_token=1e-5)
    tiers = [CPU, CPU, SSD, SSD]
    d = m.choose(tiers, prompt_tokens=4 * CHUNK_TOKENS + 100, gpu_hit=0, overlap=True)
    assert d.layerwise and d.load_chunks == 2
    # an SSD hit at the front leaves nothing to load layerwise
    d = m.choose([SSD, SSD], prompt_tokens=2 * CHUNK_TOKENS + 100, gpu_hit=0, overlap=True)
    assert not d.layerwise


def test_an_ssd_prefix_read_beside_the_prefill_of_the_rest_beats_both_extremes() -> None:
    # 64 SSD chunks of 64 MiB at 1 GB/s: 67 ms each to read, and 67 ms each to recompute
    # (1.05 ms a token): loading all or recomputing all takes about 4.3 s; reading the first
    # half while the second half computes, about half of that
    per_token = CHUNK_BYTES / 1e9 / CHUNK_TOKENS
    m = layered(cpu_gbps=50, per_token=per_token)
    prompt = 64 * CHUNK_TOKENS
    d = m.choose([SSD] * 64, prompt, gpu_hit=0, overlap=True, instep=64)
    assert d.layerwise and 28 <= d.load_chunks <= 36
    assert d.predicted_s < 0.55 * min(d.recompute_s, d.load_all_s)
    # no in-step reads allowed: the old choice, load-then-compute
    assert not m.choose([SSD] * 64, prompt, gpu_hit=0, overlap=True).layerwise
    # at most as many chunks as CPU slots can take
    capped = m.choose([SSD] * 64, prompt, gpu_hit=0, overlap=True, instep=10)
    assert capped.layerwise and capped.load_chunks == 10


def test_only_the_first_step_of_the_rest_hides_an_in_step_read() -> None:
    # As above, but the engine computes 2 chunks' tokens a step: the read overlaps those
    # alone, and the split gains little over recomputing
    per_token = CHUNK_BYTES / 1e9 / CHUNK_TOKENS
    m = layered(cpu_gbps=50, per_token=per_token)
    m.step_tokens = 2 * CHUNK_TOKENS
    d = m.choose([SSD] * 64, 64 * CHUNK_TOKENS, gpu_hit=0, overlap=True, instep=64)
    assert d.predicted_s > 0.9 * d.recompute_s


def test_uncalibrated_cpu_hit_goes_layerwise_an_ssd_hit_async() -> None:
    m = CostModel(CHUNK_BYTES, CHUNK_TOKENS, num_layers=4)
    assert m.choose([CPU, CPU], 1000, 0, overlap=True).layerwise
    assert not m.choose([CPU, SSD], 1000, 0, overlap=True).layerwise
    assert not m.choose([CPU, CPU], 1000, 0).layerwise  # without overlap: never


def test_the_start_up_probe_sets_both_cpu_bandwidths_unless_fixed() -> None:
    m = layered(cpu_gbps=10, per_token=1e-4)
    m.start_from_probe(50e9, 25e9)
    assert (m.bandwidth[CPU], m.layerwise_bandwidth) == (50e9, 25e9)
    fixed = make_cost_model(MiniFlexConfig(cpu_load_gbps=8.0), CHUNK_BYTES, CHUNK_TOKENS)
    fixed.start_from_probe(50e9, 25e9)
    assert fixed.bandwidth[CPU] == 8e9 and fixed.layerwise_bandwidth is None


def test_a_remote_run_is_loaded_only_while_its_fetch_beats_recompute() -> None:
    remote = Tier.REMOTE
    m = model(cpu_gbps=50, ssd_gbps=1, per_token=1e-4)  # 6.4 ms to recompute a chunk
    m.start_remote_from_probe(1e9)  # 67 ms to fetch one: recomputed
    assert (
        m.choose([CPU, remote, remote], prompt_tokens=4 * CHUNK_TOKENS, gpu_hit=0).load_chunks == 1
    )
    m.start_remote_from_probe(100e9)  # 0.7 ms: fetched
    assert (
        m.choose([CPU, remote, remote], prompt_tokens=4 * CHUNK_TOKENS, gpu_hit=0).load_chunks == 3
    )
    # real fetches refine the probe's figure (unless remote_read_gbps fixes it)
    m.observe_load(remote, CHUNK_BYTES, 1.0)
    assert m.bandwidth[remote] < 100e9  # a moving average from the probe on


def test_a_tier_slower_than_recomputing_the_last_chunk_is_not_asked() -> None:
    """The remote store is asked at a lookup only while a chunk from it may beat recompute:
    on a fast GPU a slow store is not asked at all (the question would wait behind its
    puts); the prompt's last chunk, whose attention costs most, decides; with no prefill
    seen, or hit_policy=load, it is asked."""
    from miniflex.scheduler.advisor import HitAdvisor

    m = CostModel(
        CHUNK_BYTES, CHUNK_TOKENS, {CPU: 50e9, Tier.REMOTE: 1e9}, prefill=None
    )  # 64 MiB: 68 ms to fetch and copy
    cost = HitAdvisor(MiniFlexConfig(), m)
    load = HitAdvisor(MiniFlexConfig(hit_policy="load"), m)
    cpu_only = HitAdvisor(MiniFlexConfig(hit_policy="cpu"), m)
    assert cost.worth_asking(Tier.REMOTE, 8192) and not cpu_only.worth_asking(Tier.REMOTE, 8192)
    m.prefill = PrefillFit(0.001, 1e-5, 1e-7)  # a chunk: 0.64 ms + 6.4 us a token before it
    assert not m.loses_to_recompute(CPU, 8192)
    assert m.loses_to_recompute(Tier.REMOTE, 8192)  # 53 ms to recompute the last chunk
    assert not cost.worth_asking(Tier.REMOTE, 8192) and load.worth_asking(Tier.REMOTE, 8192)
    assert cost.worth_asking(Tier.REMOTE, 16384)  # its last chunk: 105 ms


def test_an_in_step_ssd_load_calibrates_the_disk_not_the_layerwise_copies() -> None:
    from miniflex.plan import JobKind, JobResult, LoadTiming
    from miniflex.scheduler.advisor import HitAdvisor

    m = layered(cpu_gbps=50, per_token=1e-4)
    m.observe_layerwise(1 << 30, (1 << 30) / 40e9)
    advisor = HitAdvisor(MiniFlexConfig(), m)
    # 4 chunks read in 0.5 s inside a step that took 0.6 s from issue to the last copy
    r = JobResult(1, "r", JobKind.LOAD, True, 4 * CHUNK_BYTES, 0.6, ssd_seconds=0.5)
    advisor.observe_load(LoadTiming.LAYERWISE, 4, r)
    assert m.layerwise_bandwidth == pytest.approx(40e9)  # not the disk's pace
    assert m.bandwidth[SSD] == pytest.approx(4 * CHUNK_BYTES / 0.5)  # the first read seen
