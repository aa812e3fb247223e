"""GPU <-> CPU-pool bandwidth of each mover against the pinned ``copy_`` ceiling, and its SM cost.

    python -m bench.gpu_copy_bench [--json bench/results/components/gpu_copy_h200.json]

A Qwen3-8B-shaped KV cache (36 layers, 8 KV heads of 128, bf16, block 16,
``--blocks`` blocks per layer, LBHNC) on the GPU and a pinned, mapped pool.
For each chunk size, each mover stores (GPU -> CPU) and loads (CPU -> GPU)
random non-contiguous blocks to and from random slots, in calls of one chunk
and of each ``--tokens-per-call`` tokens; GB/s is the median call, waited for,
beside a contiguous pinned ``torch`` copy of ``--ceiling-mib`` in the same run
(the PCIe ceiling); ``layerwise`` is the same load issued layer by layer
(``load_layerwise``, as in-step loads run) and waited for. Last, a bf16
8192x8192 matmul loop (a CUDA graph on its own stream) is timed alone and
while each mover copies non-stop on another thread (64-token chunks, calls of
the first ``--tokens-per-call``): the slowdown is the SMs (and memory
bandwidth) the mover takes.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time

import torch

from miniflex.gpu import pinning
from miniflex.gpu.base import KVMover
from miniflex.gpu.kernel_mover import DEFAULT_CTAS
from miniflex.gpu.synthetic import kv_geometry, random_chunks, synthetic_caches
from miniflex.layout import layout_from_tensors
from miniflex.plan import ChunkMove
from miniflex.pool import HostPool
from miniflex.tools.bench.provenance import provenance
from miniflex.tools.bench.report import emit, format_table
from miniflex.tools.tune import Candidate, median_seconds, time_mover

QWEN3_8B = {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128}  # fmt: skip
BLOCK = 16


def log(msg: str) -> None:
    print(f"[gpu_copy_bench] {msg}", file=sys.stderr, flush=True)


def ceiling(mib: int, repeat: int) -> tuple[float, float]:
    """GB/s of one contiguous pinned copy_, device -> host and host -> device."""
    host = torch.empty(mib << 20, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")

    def rate(dst: torch.Tensor, src: torch.Tensor) -> float:
        times = []
        for _ in range(repeat + 1):
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return (mib << 20) / statistics.median(times[1:]) / 1e9

    return rate(host, dev), rate(dev, host)


def candidates(ctas: list[int]) -> list[Candidate]:
    return [
        *(Candidate("kernel", c) for c in ctas),
        Candidate("staged"),
        Candidate.named("staged-lanes"),
        Candidate("dma"),
        Candidate("cpu"),
    ]


def build(cand: Candidate, layout, kv, pool) -> KVMover | None:
    """The candidate's mover, or None (logged) where it can't run here."""
    try:
        return cand.build(layout, kv, pool)
    except Exception as exc:  # a missing library or an unsupported layout: report, go on
        log(f"{cand.label}: not measured: {type(exc).__name__}: {exc}")
        return None


def time_layerwise(mover: KVMover, chunks: list[ChunkMove], repeat: int) -> float:
    """Median seconds of ``load_layerwise(chunks)`` until every layer is in (no compute)."""
    return median_seconds(lambda: mover.load_layerwise(chunks).wait(), repeat)


def bandwidth_rows(args, kv, ceil: tuple[float, float]) -> list[dict]:
    rows = []
    for tokens in args.chunk_tokens:
        bpc = tokens // BLOCK
        layout = layout_from_tensors(kv, bpc)
        g = layout.geometry
        n_chunks = max(1, max(args.tokens_per_call) // tokens)
        pool = HostPool(2 * n_chunks, g.slot_bytes)
        pinning.pin(pool.address, pool.nbytes, mapped=True)
        batch = random_chunks(n_chunks, bpc, args.blocks, 2 * n_chunks, random.Random(tokens))
        sizes = sorted({1, *(max(1, t // tokens) for t in args.tokens_per_call)})
        for cand in candidates(args.ctas):
            mover = build(cand, layout, kv, pool)
            if mover is None:
                continue
            for calls in (batch[:n] for n in sizes):
                nbytes = len(calls) * g.chunk_bytes
                t_store, t_load = time_mover(mover, calls, args.repeat)
                t_layers = time_layerwise(mover, calls, args.repeat)
                row = {
                    "chunk_tokens": tokens,
                    "tokens_per_call": len(calls) * tokens,
                    "mover": cand.label,
                    "store_GBps": round(nbytes / t_store / 1e9, 2),
                    "store_vs_ceiling": round(nbytes / t_store / 1e9 / ceil[0], 2),
                    "load_GBps": round(nbytes / t_load / 1e9, 2),
                    "load_vs_ceiling": round(nbytes / t_load / 1e9 / ceil[1], 2),
                    "layerwise_GBps": round(nbytes / t_layers / 1e9, 2),
                    "layerwise_vs_ceiling": round(nbytes / t_layers / 1e9 / ceil[1], 2),
                }
                log(f"{row}")
                rows.append(row)
        pinning.unpin(pool.address)
        pool.close()
    return rows


class Matmul:
    """``n`` bf16 matmuls captured in a CUDA graph, replayed on their own stream."""

    def __init__(self, size: int, n: int) -> None:
        self.a = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")
        self.b = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")
        self.c = torch.empty_like(self.a)
        self.stream = torch.cuda.Stream()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self.stream):
            torch.mm(self.a, self.b, out=self.c)  # warm-up outside the capture
        self.stream.synchronize()
        with torch.cuda.graph(self.graph, stream=self.stream):
            for _ in range(n):
                torch.mm(self.a, self.b, out=self.c)
        self.n = n

    def ms_each(self) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            start.record()
            self.graph.replay()
            end.record()
        end.synchronize()
        return start.elapsed_time(end) / self.n


def busy(mover: KVMover, chunks: list[ChunkMove], stop: threading.Event, out: list[float]) -> None:
    """Store and load ``chunks`` until ``stop``; appends (bytes, seconds)."""
    moved, t0 = 0, time.perf_counter()
    while not stop.is_set():
        moved += mover.store(chunks)
        moved += mover.load(chunks)
    out += [moved, time.perf_counter() - t0]


def interference_rows(args, kv) -> list[dict]:
    tokens = 64
    layout = layout_from_tensors(kv, tokens // BLOCK)
    n_chunks = max(1, args.tokens_per_call[0] // tokens)
    pool = HostPool(2 * n_chunks, layout.geometry.slot_bytes)
    pinning.pin(pool.address, pool.nbytes, mapped=True)
    chunks = random_chunks(n_chunks, tokens // BLOCK, args.blocks, 2 * n_chunks, random.Random(9))
    mm = Matmul(8192, args.matmuls)
    mm.ms_each()
    rows = []
    for cand in candidates(args.ctas):
        mover = build(cand, layout, kv, pool)
        if mover is None:
            continue
        mover.store(chunks)  # warm-up
        alone = mm.ms_each()
        stop, out = threading.Event(), []
        thread = threading.Thread(target=busy, args=(mover, chunks, stop, out))
        thread.start()
        time.sleep(0.05)
        with_mover = mm.ms_each()
        stop.set()
        thread.join()
        row = {
            "mover": cand.label,
            "matmul_ms_alone": round(alone, 3),
            "matmul_ms_with_mover": round(with_mover, 3),
            "matmul_slowdown": round(with_mover / alone, 3),
            "mover_GBps_meanwhile": round(out[0] / out[1] / 1e9, 2),
        }
        log(f"{row}")
        rows.append(row)
    pinning.unpin(pool.address)
    pool.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--blocks", type=int, default=8192, help="vLLM blocks per layer")
    ap.add_argument("--chunk-tokens", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    ap.add_argument(
        "--tokens-per-call", type=int, nargs="+", default=[1024, 4096], help="besides one chunk"
    )
    ap.add_argument("--ctas", type=int, nargs="+", default=[DEFAULT_CTAS], help="kernel CTAs")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--ceiling-mib", type=int, default=1024)
    ap.add_argument("--matmuls", type=int, default=50, help="matmuls per timed graph replay")
    ap.add_argument("--json")
    ap.add_argument("--commit", help="the commit measured (default: git's HEAD here)")
    args = ap.parse_args()
    g = kv_geometry(QWEN3_8B, BLOCK, "bfloat16", 64)
    log(f"{torch.cuda.get_device_name()}: KV {args.blocks} blocks x {g.num_layers} layers")
    kv = synthetic_caches(g, "LBHNC", args.blocks, "cuda", fill=False)
    ceil = ceiling(args.ceiling_mib, args.repeat)
    log(f"ceiling: D2H {ceil[0]:.2f} GB/s, H2D {ceil[1]:.2f} GB/s")
    rows = bandwidth_rows(args, kv, ceil)
    interference = interference_rows(args, kv)
    import cupy

    emit(
        "GPU <-> CPU pool copies, Qwen3-8B KV (36 x 8 x 128, bf16, block 16, LBHNC), random blocks",
        rows,
        args.json,
        {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "cupy": cupy.__version__,
            "provenance": provenance(True, args.commit),
            "kv_blocks": args.blocks,
            "page_bytes": g.page_bytes,
            "ceiling_d2h_GBps": round(ceil[0], 2),
            "ceiling_h2d_GBps": round(ceil[1], 2),
            "ceiling_mib": args.ceiling_mib,
            "repeat": args.repeat,
            "interference": interference,
        },
    )
    print(f"\nbf16 8192x8192 matmul alone vs while each mover copies ({args.matmuls} per replay)")
    print(format_table(interference))


if __name__ == "__main__":
    main()
