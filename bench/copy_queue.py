"""What a store or load queued on the copy engine costs vLLM's own copies.

    python -m bench.copy_queue [--json bench/results/components/copy_queue_h200.json]

vLLM copies its sampled tokens to the host after every step and each step's
inputs to the GPU, on streams of its own; a MiniFlex store (or load) whose
copies the copy engine is serving can make them wait. Here a thread stores (then loads) one call
of ``--chunks`` chunks of a Qwen3-8B-shaped KV cache (36 layers, 8 KV heads of
128, bf16, block 16, LBHNC, ``--chunk-tokens`` per chunk) while the main thread,
``--probe-after-ms`` after the call began, copies ``--probe-bytes`` in the same
direction on a stream of its own and times it until done: the probe stands for
vLLM's copy. Rows: the staged mover with its stores through the lanes
(``staging_stores=lanes``), the staged mover as configured by default (stores
written directly by the kernel; loads through the lanes either way) and the
kernel mover (its SMs write to and read from the pool: no copy engine), each
against the probe alone and the staged mover with lane stores of the same run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable

import torch

from bench.gpu_copy_bench import BLOCK, QWEN3_8B
from miniflex.gpu import pinning
from miniflex.gpu.base import KVMover
from miniflex.gpu.synthetic import kv_geometry, random_chunks, synthetic_caches
from miniflex.layout import layout_from_tensors
from miniflex.plan import ChunkMove
from miniflex.pool import HostPool
from miniflex.tools.bench.provenance import provenance
from miniflex.tools.bench.report import emit


def log(msg: str) -> None:
    print(f"[copy_queue] {msg}", file=sys.stderr, flush=True)


class Probe:
    """vLLM's small copy: ``nbytes`` to the host (``to_host``) or to the GPU, on its own
    stream, timed from its issue until it is done."""

    def __init__(self, nbytes: int, to_host: bool) -> None:
        gpu = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
        host = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=True)
        self.dst, self.src = (host, gpu) if to_host else (gpu, host)
        self.stream = torch.cuda.Stream()

    def __call__(self) -> float:
        done = torch.cuda.Event(blocking=True)
        t0 = time.perf_counter()
        with torch.cuda.stream(self.stream):
            self.dst.copy_(self.src, non_blocking=True)
            done.record(self.stream)
        done.synchronize()
        return time.perf_counter() - t0


def during(call: Callable[[], object], probe: Probe, after: float) -> tuple[float, float]:
    """Run ``call`` on a thread; ``after`` seconds later time ``probe``. Returns the probe's
    seconds and the call's."""
    wall = [0.0]

    def run() -> None:
        t0 = time.perf_counter()
        call()
        wall[0] = time.perf_counter() - t0

    torch.cuda.synchronize()
    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(after)
    seconds = probe()
    thread.join()
    return seconds, wall[0]


def measure(label: str, mover: KVMover | None, chunks: list[ChunkMove], store: bool, args) -> dict:
    """One row: the probe's latency (median and worst of ``--repeat``) and the call's."""
    probe = Probe(args.probe_bytes, to_host=store)
    if mover is None:
        times = [probe() for _ in range(args.repeat)]
        calls: list[float] = []
    else:

        def call() -> int:
            return mover.store(chunks) if store else mover.load(chunks)

        for _ in range(2):
            call()  # warm-up: kernels compiled, buffers grown
        pairs = [during(call, probe, args.probe_after_ms / 1e3) for _ in range(args.repeat)]
        times, calls = [p for p, _ in pairs], [c for _, c in pairs]
    row = {
        "mover": label,
        "direction": "store (to host)" if store else "load (to GPU)",
        "probe_ms": round(statistics.median(times) * 1e3, 3),
        "probe_max_ms": round(max(times) * 1e3, 3),
        "call_ms": round(statistics.median(calls) * 1e3, 2) if calls else None,
    }
    log(str(row))
    return row


LANES = "staged, lane stores"


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row's probe and call against the staged mover's with lane stores, per direction."""
    base = {r["direction"]: r for r in rows if r["mover"] == LANES}
    for r in rows:
        b = base.get(r["direction"])
        r["probe_vs_lanes"] = round(r["probe_ms"] / b["probe_ms"], 3) if b else None
        both = b and r["call_ms"] and b["call_ms"]
        r["call_vs_lanes"] = round(r["call_ms"] / b["call_ms"], 3) if both else None
    return rows


def movers(layout, kv, pool) -> list[tuple[str, KVMover | None]]:
    from miniflex.gpu.kernel_mover import KernelMover
    from miniflex.gpu.staged_mover import StagedMover

    return [
        ("none (probe alone)", None),
        (LANES, StagedMover(layout, kv, pool, direct_stores=False)),
        ("staged, default (direct stores)", StagedMover(layout, kv, pool)),
        ("kernel (SMs, no copy engine)", KernelMover(layout, kv, pool)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--chunks", type=int, default=128, help="chunks per call")
    ap.add_argument("--chunk-tokens", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=4096, help="vLLM blocks per layer")
    ap.add_argument("--probe-bytes", type=int, default=4096)
    ap.add_argument("--probe-after-ms", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--commit", help="the commit measured (default: git's HEAD here)")
    ap.add_argument("--json")
    args = ap.parse_args()
    bpc = args.chunk_tokens // BLOCK
    g = kv_geometry(QWEN3_8B, BLOCK, "bfloat16", args.chunk_tokens)
    kv = synthetic_caches(g, "LBHNC", args.blocks, "cuda", fill=False)
    layout = layout_from_tensors(kv, bpc)
    pool = HostPool(2 * args.chunks, layout.geometry.slot_bytes)
    pinning.pin(pool.address, pool.nbytes, mapped=True)
    chunks = random_chunks(args.chunks, bpc, args.blocks, 2 * args.chunks, random.Random(7))
    rows = []
    for label, mover in movers(layout, kv, pool):
        for store in (True, False):
            rows.append(measure(label, mover, chunks, store, args))
    pinning.unpin(pool.address)
    call_bytes = args.chunks * layout.geometry.chunk_bytes
    emit(
        f"A {args.probe_bytes}-byte copy queued {args.probe_after_ms} ms into a call of "
        f"{args.chunks} chunks ({call_bytes / 1e9:.2f} GB; Qwen3-8B KV, "
        f"{args.chunk_tokens}-token chunks)",
        with_ratios(rows),
        args.json,
        {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "provenance": provenance(True, args.commit),
            "chunks": args.chunks,
            "chunk_tokens": args.chunk_tokens,
            "call_bytes": call_bytes,
            "probe_bytes": args.probe_bytes,
            "probe_after_ms": args.probe_after_ms,
            "repeat": args.repeat,
        },
    )


if __name__ == "__main__":
    main()
