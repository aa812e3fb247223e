"""What a store costs vLLM's thread: the interpreter time a mover's store call takes from it.

    python -m bench.store_stall [--json bench/results/components/store_stall_h200.json]

A worker's store thread runs Python (page tables, launches, events, copies)
while vLLM's thread runs its own, and only one of them holds the interpreter
lock at a time. Here a Python thread ("vLLM's") runs steps of pure-Python
work (``--step-units``), each followed by a wait without the lock
(``--step-wait-ms``, as while the GPU computes), alone and then while another
thread stores chunks of a Qwen3-8B-shaped KV cache (36 layers, 8 KV heads of
128, bf16, block 16, LBHNC, ``--chunk-tokens`` per chunk) into a pinned pool,
one call of ``n`` chunks every ``--gap-ms`` (one engine step's stores), each
after a fence. Per store call it reports the store thread's CPU and wall time,
and the time vLLM's thread lost: its steps' time beyond their mean alone (timed
just before each row), divided by the calls made meanwhile.
``--switch-interval`` sets ``sys.setswitchinterval`` (CPython's default is 5 ms).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time

import torch

from bench.gpu_copy_bench import BLOCK, QWEN3_8B, build
from miniflex.gpu import pinning
from miniflex.gpu.base import KVMover
from miniflex.gpu.synthetic import kv_geometry, random_chunks, synthetic_caches
from miniflex.layout import layout_from_tensors
from miniflex.plan import ChunkMove
from miniflex.pool import HostPool
from miniflex.tools.bench.provenance import provenance
from miniflex.tools.bench.report import emit
from miniflex.tools.tune import Candidate

UNIT = 200  # dict operations per unit of "vLLM" work (about 10 us of CPython)


def log(msg: str) -> None:
    print(f"[store_stall] {msg}", file=sys.stderr, flush=True)


def work(units: int) -> None:
    """``units`` units of pure-Python work (holds the interpreter lock throughout)."""
    d: dict[int, int] = {}
    for u in range(units):
        for i in range(UNIT):
            d[i] = d.get(i, u) + 1


def step(units: int, wait: float) -> float:
    """One "engine step" of vLLM's thread: ``units`` of Python work, then ``wait`` seconds
    without the lock (as while the GPU computes); its wall seconds."""
    t0 = time.perf_counter()
    work(units)
    time.sleep(wait)
    return time.perf_counter() - t0


class Stores(threading.Thread):
    """Stores ``chunks`` ``calls`` times, ``gap`` seconds apart, each after a fence (no
    mover: only the sleeps, for the noise floor of the measurement)."""

    def __init__(
        self, mover: KVMover | None, chunks: list[ChunkMove], calls: int, gap: float
    ) -> None:
        super().__init__(name="stores", daemon=True)
        self.mover, self.chunks, self.calls, self.gap = mover, chunks, calls, gap
        self.cpu = self.wall = 0.0
        self.moved = 0

    def run(self) -> None:
        torch.cuda.set_device(0)
        for _ in range(self.calls):
            if self.mover is None:
                time.sleep(self.gap)
                continue
            fence = self.mover.fence()
            cpu, t0 = time.thread_time(), time.perf_counter()
            self.moved += self.mover.store(self.chunks, after=fence)
            self.wall += time.perf_counter() - t0
            self.cpu += time.thread_time() - cpu
            time.sleep(self.gap)


def measure(mover: KVMover | None, chunks: list[ChunkMove], args) -> dict:
    """One row: the store thread's cost per call of ``chunks`` and the time vLLM's thread's
    steps took beyond their mean alone, measured just before (drift between rows is larger
    than the effect), per call."""
    for _ in range(3 if mover is not None else 0):
        mover.store(chunks)  # warm-up: kernels compiled, buffers grown
    wait = args.step_wait_ms / 1000
    alone = statistics.fmean(step(args.step_units, wait) for _ in range(args.alone_steps))
    stores = Stores(mover, chunks, args.calls, args.gap_ms / 1000)
    stores.start()
    steps: list[float] = []
    while stores.is_alive():
        steps.append(step(args.step_units, wait))
    lost = sum(steps) - len(steps) * alone
    return {
        "chunks_per_call": len(chunks) if mover is not None else 0,
        "store_cpu_ms": round(stores.cpu / args.calls * 1e3, 3),
        "store_wall_ms": round(stores.wall / args.calls * 1e3, 3),
        "step_ms_alone": round(alone * 1e3, 3),
        "vllm_thread_lost_ms": round(lost / args.calls * 1e3, 3),
        "store_GBps": round(stores.moved / stores.wall / 1e9, 2) if stores.wall else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--movers",
        default="staged,staged-lanes,kernel,dma",
        help="comma-separated; staged-lanes: the staged mover storing through its lanes",
    )
    ap.add_argument("--chunks", type=int, nargs="+", default=[1, 8, 32, 128], help="per call")
    ap.add_argument("--chunk-tokens", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=8192, help="vLLM blocks per layer")
    ap.add_argument("--calls", type=int, default=40, help="store calls per row")
    ap.add_argument("--gap-ms", type=float, default=5.0, help="between store calls")
    ap.add_argument("--step-units", type=int, default=100, help="Python work per step")
    ap.add_argument("--step-wait-ms", type=float, default=1.0, help="lock-free wait per step")
    ap.add_argument("--alone-steps", type=int, default=300, help="steps timed alone per row")
    ap.add_argument("--commit", help="the commit measured (default: git's HEAD here)")
    ap.add_argument("--switch-interval", type=float, help="seconds (default: CPython's)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    bpc = args.chunk_tokens // BLOCK
    g = kv_geometry(QWEN3_8B, BLOCK, "bfloat16", args.chunk_tokens)
    kv = synthetic_caches(g, "LBHNC", args.blocks, "cuda", fill=False)
    layout = layout_from_tensors(kv, bpc)
    most = max(args.chunks)
    pool = HostPool(2 * most, layout.geometry.slot_bytes)
    pinning.pin(pool.address, pool.nbytes, mapped=True)
    batch = random_chunks(most, bpc, args.blocks, 2 * most, random.Random(7))
    rows = [{"mover": "none (sleeps only)", **measure(None, batch[:1], args)}]
    for name in args.movers.split(","):
        mover = build(Candidate.named(name), layout, kv, pool)
        if mover is None:
            continue
        for n in args.chunks:
            row = {"mover": name, **measure(mover, batch[:n], args)}
            log(str(row))
            rows.append(row)
    pinning.unpin(pool.address)
    emit(
        "Store calls against a busy Python thread: its loss per call "
        f"(Qwen3-8B KV, {args.chunk_tokens}-token chunks)",
        rows,
        args.json,
        {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "switch_interval_s": sys.getswitchinterval(),
            "provenance": provenance(True, args.commit),
            "step_units": args.step_units,
            "step_wait_ms": args.step_wait_ms,
            "calls": args.calls,
            "gap_ms": args.gap_ms,
            "chunk_tokens": args.chunk_tokens,
        },
    )


if __name__ == "__main__":
    main()
