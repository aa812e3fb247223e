"""Torch mover bandwidth (vLLM CPU backend) against the memcpy ceiling of the same machine.

    python -m bench.cpu_mover_bench [--json bench/results/components/cpu_mover.json]

For each chunk size, stores then loads 256 MiB worth of chunks between a
vLLM-shaped paged KV cache (LBHNC, bf16, random block ids) and the host pool,
and prints GB/s beside a contiguous ``torch`` copy of the same number of bytes
(the ceiling: one memcpy, no gather). Best of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from miniflex.gpu.cpu_mover import TorchMover
from miniflex.layout import layout_from_tensors
from miniflex.plan import ChunkMove
from miniflex.pool import HostPool
from miniflex.tools.bench.report import emit
from miniflex.types import BlockId, SlotId

LAYERS, HEADS, HEAD, BLOCK = 8, 4, 64, 32  # the demo model's KV: 8 KiB per token


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def run(blocks_per_chunk: int, total_bytes: int, repeat: int) -> dict[str, object]:
    page = HEADS * BLOCK * 2 * HEAD * 2
    n_chunks = max(1, total_bytes // (LAYERS * blocks_per_chunk * page))
    n_blocks = n_chunks * blocks_per_chunk
    kv = {f"l{i}": torch.randn(n_blocks, HEADS, BLOCK, 2 * HEAD).bfloat16() for i in range(LAYERS)}
    layout = layout_from_tensors(kv, blocks_per_chunk)
    pool = HostPool(n_chunks, layout.geometry.slot_bytes)
    mover = TorchMover(layout, kv, pool)
    perm = torch.randperm(n_blocks).tolist()
    chunks = [
        ChunkMove(
            SlotId(i),
            tuple(BlockId(b) for b in perm[i * blocks_per_chunk : (i + 1) * blocks_per_chunk]),
        )
        for i in range(n_chunks)
    ]
    nbytes = n_chunks * layout.geometry.chunk_bytes
    src = torch.empty(nbytes, dtype=torch.uint8)
    dst = torch.empty(nbytes, dtype=torch.uint8)
    t_copy = best(lambda: dst.copy_(src), repeat)
    t_store = best(lambda: mover.store(chunks), repeat)
    t_load = best(lambda: mover.load(chunks), repeat)
    pool.close()
    gbps = lambda t: nbytes / t / 1e9  # noqa: E731
    return {
        "chunk_tokens": blocks_per_chunk * BLOCK,
        "chunk_KiB": layout.geometry.chunk_bytes // 1024,
        "memcpy_GBps": round(gbps(t_copy), 2),
        "store_GBps": round(gbps(t_store), 2),
        "load_GBps": round(gbps(t_load), 2),
        "store_vs_memcpy": round(t_copy / t_store, 2),
        "load_vs_memcpy": round(t_copy / t_load, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--total-mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for bpc in (1, 2, 4, 8, 16):
        print(f"[cpu_mover_bench] {bpc * BLOCK}-token chunks", file=sys.stderr, flush=True)
        rows.append(run(bpc, args.total_mib << 20, args.repeat))
    emit(
        "torch mover vs memcpy (vLLM CPU backend layout)",
        rows,
        args.json,
        {
            "torch_threads": torch.get_num_threads(),
            "layers": LAYERS,
            "page_bytes": HEADS * BLOCK * 4 * HEAD,
        },
    )


if __name__ == "__main__":
    main()
