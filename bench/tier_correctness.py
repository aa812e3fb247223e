"""Every tier's hit against vLLM's own: the CPU tier, SSD and the remote store, per model kind.

    python -m bench.tier_correctness [--kinds llama mla-v2] [--kv-cache-dtypes auto fp8]
                                     [--prompts 2] [--prompt-len 1000] [--tokens 16]
                                     [--ssd-dir DIR] [--json PATH] [--commit SHA]

For each kind and KV dtype, engine A (MiniFlex with a CPU tier of about one and a half
prompts, an SSD tier and a private ``redis-server`` written through) serves each prompt
cold, again (vLLM's own prefix-cache hit: the reference) and once more after vLLM's copy
was dropped (MiniFlex's CPU tier). Fresh prompts then push the first ones out of the CPU
tier, and each is served again from SSD. Engine B (a CPU tier only, the same store) starts
after A has shut down (its queued puts go out first) and serves each prompt from the store.

Chunks of one block, so that every hit covers the tokens vLLM's own covers, and
``hit_policy=load``. The same KV bytes give the same logprobs, so each tier's hit must
equal vLLM's own hit exactly (0 mismatches, 0 logprob difference); vLLM's own hit against
cold shows the recompute path's noise. Where vLLM has no prefix cache for a kind (MLA on
a CPU without AMX) the reference is MiniFlex's CPU-tier hit, and the row says so. Needs
``redis-server`` on PATH and the redis client.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

from bench.correctness import KINDS, Output, compare, generate, run_one, write_model
from miniflex.model_shape import ModelShape
from miniflex.remote.local_server import private_store
from miniflex.tools import offline_llm

TIERS = ("cpu", "ssd", "remote")
FILLERS = 3
"""Fresh prompts served between the CPU-tier hits and the SSD hits: with a CPU tier of
one and a half prompts, they leave none of the measured prompts there."""


def _sizes(model: Path, args: argparse.Namespace, dtype: str) -> dict[str, str]:
    per_token = ModelShape.from_dir(model).kv_bytes_per_token or 0
    prompt_bytes = per_token * args.prompt_len // (2 if dtype == "fp8" else 1)
    return {
        "cpu_bytes": str(prompt_bytes * 3 // 2),
        "ssd_bytes": str(max(64 << 20, 4 * prompt_bytes * (args.prompts + FILLERS))),
    }


def _engine(model: Path, config: dict[str, Any], args: argparse.Namespace, dtype: str) -> Any:
    return offline_llm.make_llm(
        model,
        {"blocks_per_chunk": 1, "hit_policy": "load", **config},
        max_model_len=args.prompt_len + args.tokens + 64,
        kv_cache_dtype=dtype,
        kv_cache_memory_bytes=args.kv_bytes,
    )


def _serve(llm: Any, tokens: list[int], args: argparse.Namespace) -> tuple[Output, dict]:
    out, raw = generate(llm, tokens, args.tokens)
    by_tier = offline_llm.miniflex_hits_by_tier(raw)
    return out, {"cached": raw.num_cached_tokens or 0, "by_tier": by_tier}


def _engine_a(
    llm: Any, prompts: list[list[int]], args: argparse.Namespace, rng: random.Random
) -> dict[str, list[tuple[Output, dict]]]:
    """Cold, vLLM's own hit and the CPU-tier hit of each prompt, then each one from SSD."""
    runs: dict[str, list[tuple[Output, dict]]] = {"cold": [], "own": [], "cpu": [], "ssd": []}
    for p in prompts:
        runs["cold"].append(_serve(llm, p, args))
        runs["own"].append(_serve(llm, p, args))
        offline_llm.evict_gpu_prefix_cache(llm)
        runs["cpu"].append(_serve(llm, p, args))
    for _ in range(FILLERS):
        _serve(llm, _prompt(rng, args.prompt_len), args)
    for p in prompts:
        offline_llm.evict_gpu_prefix_cache(llm)
        runs["ssd"].append(_serve(llm, p, args))
    return runs


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 2000) for _ in range(n)]


def measure(model: Path, kind: str, dtype: str, url: str, args: argparse.Namespace) -> dict:
    """One kind and KV dtype through every tier (see the module's docstring)."""
    rng = random.Random(f"{kind}-{dtype}")
    prompts = [_prompt(rng, args.prompt_len) for _ in range(args.prompts)]
    sizes = _sizes(model, args, dtype)
    with tempfile.TemporaryDirectory(dir=args.ssd_dir) as ssd:
        local = {"ssd_dirs": ssd, "ssd_bytes": sizes["ssd_bytes"], "remote_write": "through"}
        a = {"cpu_bytes": sizes["cpu_bytes"], "remote_url": url, **local}
        llm = _engine(model, a, args, dtype)
        try:
            cache = llm.llm_engine.vllm_config.cache_config
            apc, block = bool(cache.enable_prefix_caching), int(cache.block_size)
            runs = _engine_a(llm, prompts, args, rng)
        finally:
            offline_llm.shutdown_llm(llm)  # write-through's queued puts go out first
    llm = _engine(model, {"cpu_bytes": sizes["cpu_bytes"], "remote_url": url}, args, dtype)
    try:
        runs["remote"] = [_serve(llm, p, args) for p in prompts]
    finally:
        offline_llm.shutdown_llm(llm)
    row = _row(kind, dtype, apc, runs, (args.prompt_len - 1) // block * block)
    return row | {"block_size": block}


def _row(
    kind: str, dtype: str, apc: bool, runs: dict[str, list[tuple[Output, dict]]], whole: int
) -> dict:
    """The comparisons of one kind: each tier's hit against the reference (itself, for the
    CPU tier's where that is the reference), and whether each hit covers ``whole`` tokens
    (every whole block before the prompt's last token)."""
    reference = "own" if apc else "cpu"
    row: dict[str, Any] = {"kind": kind, "kv_cache_dtype": dtype, "reference": reference}
    row["vllm_hit_tokens"] = [info["cached"] for _, info in runs["own"]]
    pairs = {f"{t}_vs_reference": t for t in TIERS} | {"reference_vs_cold": "cold"}
    for name, tier in pairs.items():
        a, b = (reference, "cold") if tier == "cold" else (tier, reference)
        results = [compare(x, y) for (x, _), (y, _) in zip(runs[a], runs[b], strict=True)]
        row[f"{name}_mismatches"] = sum(m for m, _ in results)
        row[f"{name}_max_dlogprob"] = max(d for _, d in results)
    for tier in TIERS:
        row[f"{tier}_hits_by_tier"] = [info["by_tier"] for _, info in runs[tier]]
        row[f"{tier}_hit_covers_prompt"] = all(
            sum(info["by_tier"].values()) == whole for _, info in runs[tier]
        )
        row[f"{tier}_served_from_it"] = all(
            info["by_tier"].get(tier, 0) > 0 for _, info in runs[tier]
        )
    return row


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", nargs="+", default=["llama", "mla-v2"], choices=KINDS[:3])
    dtypes = ("auto", "fp8")
    ap.add_argument("--kv-cache-dtypes", nargs="+", default=list(dtypes), choices=dtypes)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=16, help="generated tokens per prompt")
    ap.add_argument("--kv-bytes", type=int, default=64 << 20, help="vLLM's KV cache")
    ap.add_argument("--ssd-dir", help="where the SSD tier's files go: a file system with O_DIRECT")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--commit", default=None, help="the commit measured (a tree without git)")
    args = ap.parse_args(argv)
    if args.prompts < 1 or args.prompt_len < 64 or args.tokens < 1:
        ap.error("--prompts and --tokens must be at least 1, --prompt-len at least 64")
    return args


def run_all(args: argparse.Namespace) -> tuple[list[dict], dict[str, str]]:
    """Every kind and dtype over one private store: the rows, and why each failed one did."""
    rows: list[dict] = []
    not_run: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        store = stack.enter_context(private_store(Path(tmp) / "store"))
        for kind in args.kinds:
            model = write_model(kind, Path(tmp))
            for dtype in args.kv_cache_dtypes:
                run_one(
                    rows,
                    not_run,
                    f"{kind} {dtype}",
                    partial(measure, model, kind, dtype, store.url, args),
                )
    return rows, not_run


def table(rows: list[dict], not_run: dict[str, str]) -> str:
    head = ["kind", "kv dtype", "reference", *(f"{t} hit vs it" for t in TIERS), "it vs cold"]
    lines = [" | ".join(head) + "   (token mismatches / max logprob difference)"]
    for r in rows:
        cells = [
            f"{r[f'{t}_vs_reference_mismatches']} / {r[f'{t}_vs_reference_max_dlogprob']:.4f}"
            + ("" if r[f"{t}_served_from_it"] else " (not from it)")
            + ("" if r[f"{t}_hit_covers_prompt"] else " (shorter hit)")
            for t in TIERS
        ]
        cold = f"{r['reference_vs_cold_mismatches']} / {r['reference_vs_cold_max_dlogprob']:.4f}"
        lines.append(" | ".join([r["kind"], r["kv_cache_dtype"], r["reference"], *cells, cold]))
    lines += [f"not run: {name}: {why}" for name, why in not_run.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("PYTHONHASHSEED", "0")  # both engines name chunks alike
    rows, not_run = run_all(args)
    print(table(rows, not_run))
    if args.json:
        from miniflex.tools.bench.offline_driver import on_cuda
        from miniflex.tools.bench.provenance import provenance

        record = {"provenance": provenance(on_cuda(), args.commit), "command": sys.argv}
        record |= {"settings": {k: str(v) for k, v in vars(args).items()}, "rows": rows}
        args.json.write_text(json.dumps(record | {"not_run": not_run}, indent=1))
    bad = [r for r in rows if not all(r[f"{t}_served_from_it"] for t in TIERS)]
    bad += [r for r in rows if not all(r[f"{t}_hit_covers_prompt"] for t in TIERS)]
    bad += [
        r
        for r in rows
        for t in TIERS
        if r[f"{t}_vs_reference_mismatches"] or r[f"{t}_vs_reference_max_dlogprob"]
    ]
    return 1 if not_run or bad else 0


if __name__ == "__main__":
    sys.exit(main())
