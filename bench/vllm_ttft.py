"""TTFT of a long prompt evicted from vLLM's KV cache: APC recompute vs MiniFlex's CPU tier.

    python -m bench.vllm_ttft --model bench/models/qwen3-8b-shape --load-format dummy \\
        --prompt-tokens 30000 --gpu-blocks 2600 --cpu-bytes 64GiB --json bench/results/ttft.json

Per engine (same settings, APC alone and with MiniFlex): a warm-up request,
prompt A cold, prompt B of the same length (vLLM's KV holds only one of them,
so B evicts A; vLLM evicts a prompt's tail first, so a prefix of A may stay on
the GPU and is reported as ``vllm_hit_tokens``), then A again. With APC alone
the rest of A is recomputed; with MiniFlex it is loaded from the CPU tier.
TTFT is the wall time of a ``max_tokens=1`` request; the first sampled token of
both A runs must match.
On the CPU backend pass ``--kv-bytes`` instead of ``--gpu-blocks``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from bench.report import emit
from miniflex.connector.offline import make_llm, miniflex_hit_tokens, shutdown_llm


def log(msg: str) -> None:
    print(f"[vllm_ttft {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prompt(seed: int, n: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, vocab - 100) for _ in range(n)]


def timed(llm: Any, tokens: list[int]) -> tuple[float, int, int, int]:
    """(TTFT ms, first token, MiniFlex hit tokens, vLLM's own prefix-cache hit tokens)."""
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=1, temperature=0, detokenize=False)
    t0 = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": tokens}], sp, use_tqdm=False)[0]
    ms = 1e3 * (time.perf_counter() - t0)
    mf = miniflex_hit_tokens(out) or 0
    return ms, out.outputs[0].token_ids[0], mf, (out.num_cached_tokens or 0) - mf


def run_engine(args: argparse.Namespace, name: str, mf: dict | None, vocab: int) -> dict:
    engine: dict[str, Any] = {
        "load_format": args.load_format,
        "block_size": args.block_size,
        "max_model_len": args.prompt_tokens + 64,
        "max_num_batched_tokens": args.batched_tokens,
    }
    if args.gpu_blocks:
        engine |= {"num_gpu_blocks_override": args.gpu_blocks, "gpu_memory_utilization": 0.9}
    else:
        engine["kv_cache_memory_bytes"] = args.kv_bytes
    log(f"starting {name}")
    llm = make_llm(args.model, mf, **engine)
    try:
        a, b = prompt(1, args.prompt_tokens, vocab), prompt(2, args.prompt_tokens, vocab)
        timed(llm, prompt(3, 512, vocab))  # warm-up
        cold_ms, cold_tok, _, _ = timed(llm, a)
        log(f"{name}: cold {cold_ms:.1f} ms")
        evict_ms, *_ = timed(llm, b)
        hit_ms, hit_tok, hit, gpu_hit = timed(llm, a)
        log(f"{name}: after eviction {hit_ms:.1f} ms, MiniFlex hit {hit} tokens")
    finally:
        shutdown_llm(llm)
    return {
        "engine": name,
        "prompt_tokens": args.prompt_tokens,
        "cold_ms": round(cold_ms, 1),
        "evictor_ms": round(evict_ms, 1),
        "after_eviction_ms": round(hit_ms, 1),
        "vllm_hit_tokens": gpu_hit,
        "miniflex_hit_tokens": hit,
        "same_first_token": cold_tok == hit_tok,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", required=True)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--prompt-tokens", type=int, default=30000)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--batched-tokens", type=int, default=8192)
    ap.add_argument("--gpu-blocks", type=int, help="num_gpu_blocks_override (GPU)")
    ap.add_argument("--kv-bytes", type=int, help="kv_cache_memory_bytes (CPU backend)")
    ap.add_argument("--cpu-bytes", default="64GiB", help="MiniFlex CPU tier size")
    ap.add_argument(
        "--engines",
        default="apc,miniflex",
        help="comma-separated: apc, miniflex (mover auto), miniflex-kernel, miniflex-dma, "
        "miniflex-cpu",
    )
    ap.add_argument("--json")
    args = ap.parse_args()
    if not (args.gpu_blocks or args.kv_bytes):
        ap.error("give --gpu-blocks (GPU) or --kv-bytes (CPU backend)")
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    rows = []
    for name in args.engines.split(","):
        mf = None
        if name.startswith("miniflex"):  # miniflex (mover auto) or miniflex-<mover>
            mover = name.removeprefix("miniflex").removeprefix("-") or "auto"
            mf = {"cpu_bytes": args.cpu_bytes, "mover": mover}
        elif name != "apc":
            ap.error(f"unknown engine {name!r}: apc, miniflex, miniflex-<mover>")
        rows.append(run_engine(args, name, mf, vocab))
    by = {r["engine"]: r for r in rows}
    extra: dict[str, Any] = {
        "model": args.model,
        "block_size": args.block_size,
        "gpu_blocks": args.gpu_blocks,
        "kv_bytes": args.kv_bytes,
    }
    for r in rows:
        if "apc" in by and r["engine"] != "apc":
            r["speedup_vs_apc"] = round(by["apc"]["after_eviction_ms"] / r["after_eviction_ms"], 2)
    emit("TTFT after eviction: APC recompute vs MiniFlex CPU tier", rows, args.json, extra)


if __name__ == "__main__":
    main()
