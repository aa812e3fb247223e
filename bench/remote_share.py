"""A second engine's TTFT on a prompt a first engine computed, served through the remote store.

    python -m bench.remote_share [--model DIR] [--load-format dummy] [--prompt-tokens 2048]
        [--repeat 3] [--gpu-blocks N] [--block-size 32] [--cpu-bytes 1GiB] [--url URL]
        [--server-memory SIZE] [--server-io-threads 1]
        [--server redis-server|valkey-server|mooncake] [--server-cluster N]
        [--b-hit-policies cost,load] [--gpu-memory-utilization 0.9] [--eager] [--json PATH]

Engine A (MiniFlex with ``remote_url``) computes one fresh prompt per length
and repeat; write-through puts its chunks in the store, and A shuts down
(its queued puts go out first). Engine B then starts with empty local tiers,
computes a few fresh prompts so that its cost model is calibrated, as a warm
server's is, and, per prompt:

1. **recompute**: a fresh prompt of the same length (nothing cached anywhere);
2. **remote**: A's prompt, fetched from the store into B's CPU tier and loaded;
3. **cpu**: A's prompt again after vLLM's own copy was dropped, now a hit in
   B's CPU tier (what a single engine gets).

Both engines get ``PYTHONHASHSEED`` (0 unless set), so that they chain their block hashes
from the same seed (vLLM 0.26 otherwise seeds them per process). TTFT is the wall time of
a one-token request. The table and the JSON give the
medians and ``recompute / remote``, the speed-up a replica gets from a prompt
another replica computed. Each JSON row also gives the remote request's load times
(``remote_load_s``: ``queued`` is its wait for vLLM's KV space) and ``remote_blocks_held``:
B's finished requests whose blocks came back meanwhile (the fresh prompt's, kept for its
stores) and their seconds held. Without ``--url`` a private store runs on free ports
(``bench.share_store``): a ``redis-server`` (8gb unless ``--server-memory``), or
with ``--server mooncake`` a Mooncake Store, a master and one holder whose segment is
``--server-memory`` or else sized from the model's KV bytes per token and the
tokens the run writes. Without ``--model``, the demo's
locally generated model (real random weights; ``miniflex demo``) on the CPU backend.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.share_store import (
    MOONCAKE,
    SERVERS,
    SharedStore,
    given_store,
    private_share_store,
    server_args_error,
    store_tokens,
    wait_for_puts,
)
from miniflex.config import parse_size
from miniflex.cost import MIN_STEPS, MIN_TOKENS
from miniflex.remote.local_mooncake import mooncake_missing
from miniflex.tools.bench.argtypes import primaries
from miniflex.tools.bench.configs import TierSizes, parse_configs, with_settings
from miniflex.tools.bench.offline_driver import EngineSettings, OfflineDriver, on_cuda
from miniflex.tools.bench.provenance import provenance

STEPS = ("recompute", "remote", "cpu")
WARM_TOKENS = 256
"""Each engine's first prompt, untimed (A's and B's differ)."""


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.remote_share", description=__doc__)
    p.add_argument("--model", help="model directory (default: the demo's generated model)")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--prompt-tokens", default="2048", help="comma-separated lengths")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--gpu-blocks", type=int, default=None, help="vLLM's KV cache, in blocks")
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--cpu-bytes", default="1GiB", help="MiniFlex's CPU tier per engine")
    p.add_argument(
        "--write-backlog", default="16GiB", help="remote_write_backlog: puts that may wait"
    )
    p.add_argument(
        "--b-hit-policies",
        default="cost",
        help="engine B's hit_policy, comma-separated: one engine B each (load: fetch even "
        "where the cost model would recompute)",
    )
    p.add_argument("--url", default=None, help="an existing store (default: a private one)")
    p.add_argument(
        "--server-memory",
        default=None,
        help="the private store's maxmemory (default 8gb), or Mooncake holder's segment "
        "(default: sized from the KV the run writes)",
    )
    p.add_argument(
        "--server-io-threads", type=int, default=1, help="the private store's io-threads"
    )
    p.add_argument("--server", choices=SERVERS, default=None, help="the private store's binary")
    p.add_argument(
        "--server-cluster",
        type=primaries,
        default=0,
        help="the private store: a cluster of this many primaries (0: one server)",
    )
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="vLLM's share of GPU memory (a model that leaves little beside it needs more)",
    )
    p.add_argument("--eager", action="store_true", help="no torch.compile or CUDA graphs")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--commit", default=None, help="the commit measured (a tree without git)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, start nothing")
    args = p.parse_args(argv)
    if (error := server_args_error(args)) is not None:
        p.error(error)
    return args


ModelInfo = tuple[str, int, int]


def _model(args: argparse.Namespace) -> ModelInfo:
    """(model path, vocabulary size, KV bytes per token on the CPU backend)."""
    if args.model:
        cfg = json.loads((Path(args.model) / "config.json").read_text())
        heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        return args.model, cfg["vocab_size"], cfg["num_hidden_layers"] * heads * head_dim * 4
    from miniflex.tools.demo import KV_BYTES_PER_TOKEN, SPEC
    from miniflex.tools.tinymodel import write_tiny_model

    path = write_tiny_model(Path(tempfile.gettempdir()) / "miniflex-demo-model", SPEC)
    return str(path), SPEC.vocab_size, KV_BYTES_PER_TOKEN


def _log(msg: str) -> None:
    print(f"[remote_share] {msg}", file=sys.stderr, flush=True)


def _engine(
    url: str, args: argparse.Namespace, settings: EngineSettings, policy: str = "cost"
) -> OfflineDriver:
    text = f"miniflex-cpu+remote_write_backlog={args.write_backlog}+hit_policy={policy}"
    config = with_settings(parse_configs(text)[0], {"remote_url": url})  # may hold ',' and '+'
    cpu = parse_size("cpu_bytes", args.cpu_bytes)
    tiers = TierSizes(cpu, cpu, 0, None, 0)
    return OfflineDriver(config, settings, tiers)


def _settings(args: argparse.Namespace, model: str, kv_bytes: int) -> EngineSettings:
    longest = max(int(n) for n in args.prompt_tokens.split(","))
    blocks = args.gpu_blocks or -(-2 * longest // args.block_size)
    return EngineSettings(
        model=model,
        block_size=args.block_size,
        gpu_blocks=blocks,
        max_model_len=longest + 64,
        kv_bytes_per_token=kv_bytes,
        load_format=args.load_format,
        max_num_batched_tokens=args.max_num_batched_tokens,
        eager=args.eager,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )


def measure(store: SharedStore, args: argparse.Namespace, model_info: ModelInfo) -> dict[str, Any]:
    model, vocab, kv_bytes = model_info
    url = store.url
    lengths = [int(n) for n in args.prompt_tokens.split(",")]
    settings = _settings(args, model, kv_bytes)
    rng = random.Random(0)
    cases = [
        (n, r, [rng.randrange(3, vocab) for _ in range(n)])
        for n in lengths
        for r in range(args.repeat)
    ]
    warm = [rng.randrange(3, vocab) for _ in range(WARM_TOKENS)]
    _log(f"{store.about}: {url}")
    _log(f"engine A: computes {len(cases)} prompts")
    a = _engine(url, args, settings)
    try:
        a.prefill(warm, "warmup")
        for _n, _r, tokens in cases:
            a.prefill(tokens, "compute")
        keys = wait_for_puts(store)
        _log(
            "the store's keys are not counted (engine A's shutdown flushes its puts)"
            if keys is None
            else f"the store holds {keys} keys"
        )
    finally:
        a.close()  # write-through's queued puts go out first
    rows: list[dict[str, Any]] = []
    for policy in args.b_hit_policies.split(","):
        _log(f"engine B (hit_policy={policy}): fresh local tiers")
        rows += _serve_b(url, args, settings, policy, cases, warm, rng, vocab)
    return {
        "model": model,
        "store": url,
        "store_about": store.about,
        "settings": vars(args),
        "rows": rows,
        "kv_bytes_per_token": kv_bytes,
        "summary": summary(rows, kv_bytes),
    }


def _serve_b(
    url: str,
    args: argparse.Namespace,
    settings: EngineSettings,
    policy: str,
    cases: list[tuple[int, int, list[int]]],
    warm: list[int],
    rng: random.Random,
    vocab: int,
) -> list[dict[str, Any]]:
    """Engine B's three TTFTs per case (see the module's docstring), with ``policy``."""
    b = _engine(url, args, settings, policy)
    rows: list[dict[str, Any]] = []
    try:
        b.prefill(warm[::-1], "warmup")
        _calibrate(b, rng, vocab, longest=max(n for n, _r, _t in cases))
        for n, r, tokens in cases:
            fresh = [rng.randrange(3, vocab) for _ in range(n)]
            samples = {"recompute": b.prefill(fresh, "recompute")}
            held = b.blocks_held()
            samples["remote"] = b.prefill(tokens, "remote")
            held_after = b.blocks_held()
            b.evict_gpu()
            samples["cpu"] = b.prefill(tokens, "cpu")
            rows.append(
                {"hit_policy": policy, "prompt_tokens": n, "repeat": r}
                | {f"{k}_ms": s.ttft_ms for k, s in samples.items()}
                | {f"{k}_tiers": dict(s.tiers) for k, s in samples.items()}
                | {f"{k}_load_s": dict(s.load_s) for k, s in samples.items() if s.load_s}
                | _held_during(held, held_after)
            )
            _log(
                f"{policy}: {n} tokens #{r}: "
                + ", ".join(f"{k} {s.ttft_ms:.1f} ms" for k, s in samples.items())
            )
    finally:
        b.close()
    return rows


def _held_during(
    before: tuple[float, float] | None, after: tuple[float, float] | None
) -> dict[str, Any]:
    """``remote_blocks_held``: B's finished requests whose blocks came back while its remote
    request waited or loaded (the fresh prompt's, held for its stores), and their seconds
    held in all; nothing where the counters are not there."""
    if before is None or after is None:
        return {}
    n, seconds = after[0] - before[0], after[1] - before[1]
    return {"remote_blocks_held": {"requests": int(n), "seconds": round(seconds, 4)}}


def _calibrate(b: OfflineDriver, rng: random.Random, vocab: int, longest: int) -> None:
    """Fresh prompts of several lengths, enough prefill steps for the cost model's fit:
    before it, the model weighs SSD and remote chunks against a rough mean seconds per
    token (and loads CPU hits whole), and B's measured requests should be decided as a
    warm server decides them."""
    for n in calibration_lengths(longest):
        b.prefill([rng.randrange(3, vocab) for _ in range(n)], "calibrate")


def calibration_lengths(longest: int) -> list[int]:
    """The lengths of :func:`_calibrate`'s prompts: several, none past ``longest``."""
    return [min(MIN_TOKENS * (2 + i % 4), max(longest, MIN_TOKENS)) for i in range(MIN_STEPS)]


def summary(rows: list[dict[str, Any]], kv_bytes: int = 0) -> list[dict[str, Any]]:
    """Medians per engine B policy and prompt length, and the ratios of interest.

    ``fetch_gbps``: the bytes of the remote hit over the time it took beyond the same
    prompt's CPU-tier hit (what the fetch adds to a load; None without a remote hit or
    ``kv_bytes``, the KV bytes per token, or where the second request was not all a CPU
    hit: a CPU tier smaller than the prompt). ``hit_gbps``: the remote hit's bytes over
    the whole TTFT of the request it served (a floor of the fetch's speed).
    ``remote_queued_s``: the remote request's wait for vLLM's KV space (``load_queued_s``);
    ``remote_held_s``: the seconds B's earlier requests' blocks were held for MiniFlex that
    ended meanwhile (``remote_blocks_held``); None where a row did not record them."""
    out = []
    for policy, n in sorted({(r.get("hit_policy", "cost"), r["prompt_tokens"]) for r in rows}):
        mine = [
            r for r in rows if r["prompt_tokens"] == n and r.get("hit_policy", "cost") == policy
        ]
        med = {k: statistics.median(r[f"{k}_ms"] for r in mine) for k in STEPS}
        remote_tokens = min(r["remote_tiers"].get("remote", 0) for r in mine)
        extra_s = (med["remote"] - med["cpu"]) / 1e3
        cpu_hit = all(set(r.get("cpu_tiers", {})) <= {"cpu"} for r in mine)
        fetch = (
            remote_tokens * kv_bytes / extra_s / 1e9
            if remote_tokens and extra_s > 0 and cpu_hit
            else None
        )
        hit = remote_tokens * kv_bytes / (med["remote"] / 1e3) / 1e9 if remote_tokens else None
        queued = _median_of(r.get("remote_load_s", {}).get("queued") for r in mine)
        held = _median_of(r.get("remote_blocks_held", {}).get("seconds") for r in mine)
        out.append(
            {"hit_policy": policy, "prompt_tokens": n, "runs": len(mine)}
            | {f"{k}_ms": round(v, 1) for k, v in med.items()}
            | {
                "remote_hit_tokens_min": remote_tokens,
                "recompute_over_remote": round(med["recompute"] / med["remote"], 2),
                "remote_over_cpu": round(med["remote"] / med["cpu"], 2),
                "fetch_gbps": None if fetch is None else round(fetch, 2),
                "hit_gbps": round(hit, 2) if hit else None,
                "remote_queued_s": queued,
                "remote_held_s": held,
            }
        )
    return out


def _median_of(values: Iterable[float | None]) -> float | None:
    """The median of the values given (None where any row lacks one: not recorded)."""
    known = list(values)
    if not known or any(v is None for v in known):
        return None
    return round(statistics.median(known), 3)  # type: ignore[type-var]


def table(result: dict[str, Any]) -> str:
    lines = [
        "| B's hit_policy | prompt | recompute ms | remote ms | cpu ms | recompute/remote "
        "| remote/cpu | remote hit | fetch GB/s | hit GB/s | remote queued s | held s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result["summary"]:
        lines.append(
            f"| {s['hit_policy']} | {s['prompt_tokens']} | {s['recompute_ms']} | "
            f"{s['remote_ms']} | {s['cpu_ms']} | "
            f"{s['recompute_over_remote']}x | {s['remote_over_cpu']}x | "
            f"{s['remote_hit_tokens_min']} | {s.get('fetch_gbps')} | {s.get('hit_gbps')} | "
            f"{s.get('remote_queued_s')} | {s.get('remote_held_s')} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _args(argv)
    # Both engines must chain their block hashes from the same seed, or B cannot name A's
    # chunks: vLLM 0.26 seeds them randomly per process unless PYTHONHASHSEED is set (the
    # engine processes inherit it), as `miniflex serve` does for a remote tier.
    os.environ.setdefault("PYTHONHASHSEED", "0")
    if args.server == MOONCAKE and (missing := mooncake_missing()) is not None:
        sys.exit(f"remote_share: --server mooncake: {missing}")
    lengths = [int(n) for n in args.prompt_tokens.split(",")]
    calibration = sum(calibration_lengths(max(lengths)))
    engines_b = len(args.b_hit_policies.split(","))
    tokens = store_tokens(lengths, args.repeat, engines_b, WARM_TOKENS, calibration)
    if args.dry_run:
        model = args.model or "(the demo's generated model)"
        plan = {"settings": vars(args), "engine": vars(_settings(args, model, 0))}
        print(json.dumps(plan | {"store_tokens": tokens}, indent=1))
        return 0
    model_info = _model(args)
    if args.url:
        result = measure(given_store(args.url), args, model_info)
    else:
        with (
            tempfile.TemporaryDirectory() as tmp,
            private_share_store(tmp, args, tokens, model_info[2]) as store,
        ):
            result = measure(store, args, model_info)
    result["provenance"] = provenance(on_cuda(), args.commit)
    publish(result, args.json, table(result))
    return 0


def publish(result: dict[str, Any], json_path: str | None, table_text: str) -> None:
    """Print ``result`` as JSON, then its table; also write the JSON to ``json_path``."""
    text = json.dumps(result, indent=1)
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(text + "\n")
    print(text)
    print(table_text)


if __name__ == "__main__":
    sys.exit(main())
