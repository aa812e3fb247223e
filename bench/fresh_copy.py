"""Chunk copies into fresh memory against copies into buffers used before.

    python -m bench.fresh_copy [--chunk-bytes 9MiB] [--chunks 256] [--repeat 3]
                               [--threads 4] [--json PATH] [--commit SHA]

The remote tier's write-through copies each stored chunk into a buffer of its own
(``remote/uploader.py``), and a job that overwrites the chunk's CPU slot waits for that
copy. Buffers are reused once put, so only a burst past the buffers made so far copies
into fresh memory, whose every page faults on first touch. Per round, ``--chunks``
chunks are copied four ways, one after the other, from one source chunk, with
``copy_into`` as the uploader copies:

- ``reused``: into buffers written before (the ceiling: memory bandwidth);
- ``fresh``: into new ``np.empty`` buffers, as the uploader allocates them, on one thread;
- ``fresh_threads``: the same, the chunks dealt to ``--threads`` threads (the uploader's
  ``remote_copy_threads``);
- ``fresh_huge``: into new anonymous mappings advised ``MADV_HUGEPAGE`` (transparent huge
  pages where the kernel grants them, ``/sys/kernel/mm/transparent_hugepage``).

Run as a program, every buffer is fresh memory (``bench/fresh_memory.py``): without
that, glibc would hand a round the pages of the buffers an earlier round freed.

Prints JSON (each round's GB/s, and the medians over ``--repeat`` rounds) and a table of
the medians, each fresh copy as a fraction of the reused one. Fresh memory's speed depends
on what the kernel (and, in a VM, the host) must do to back a page, so rounds scatter.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.fresh_memory import fresh_buffers
from miniflex.bytecopy import copy_into
from miniflex.config.parse import parse_size
from miniflex.tools.bench.provenance import provenance

WAYS = ("reused", "fresh", "fresh_threads", "fresh_huge")
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_buffer(nbytes: int) -> np.ndarray:
    """Fresh anonymous memory advised for transparent huge pages (where the kernel has them)."""
    area = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError, AttributeError):  # no THP: ordinary pages
        area.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(area, dtype=np.uint8)


def _round(
    src: np.ndarray, chunks: int, alloc: Callable[[int], np.ndarray] | None, threads: int = 1
) -> float:
    """GB/s of copying ``src`` into ``chunks`` buffers from ``alloc`` (None: reused ones),
    the chunks dealt to ``threads`` threads."""
    kept = [np.ones(src.size, dtype=np.uint8) for _ in range(chunks)] if alloc is None else []
    held: list[np.ndarray] = []  # as the uploader holds its queued buffers

    def copies(first: int) -> None:
        for i in range(first, chunks, threads):
            buf = kept[i] if alloc is None else alloc(src.size)
            copy_into(buf, 0, src)
            held.append(buf)

    workers = [threading.Thread(target=copies, args=(t,)) for t in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return chunks * src.size / (time.perf_counter() - t0) / 1e9


def measure(chunk_bytes: int, chunks: int, repeat: int, threads: int) -> dict[str, list[float]]:
    """GB/s of each way in each of ``repeat`` rounds (the ways in turn within a round)."""
    src = np.random.default_rng(0).integers(0, 255, chunk_bytes, dtype=np.uint8)
    fresh = lambda n: np.empty(n, dtype=np.uint8)  # noqa: E731
    allocs = {"reused": None, "fresh": fresh, "fresh_threads": fresh, "fresh_huge": huge_buffer}
    runs: dict[str, list[float]] = {w: [] for w in WAYS}
    for r in range(repeat):
        for way in WAYS:
            n = threads if way == "fresh_threads" else 1
            runs[way].append(_round(src, chunks, allocs[way], n))
        done = ", ".join(f"{w} {runs[w][-1]:.2f} GB/s" for w in WAYS)
        print(f"[fresh_copy] round {r + 1}/{repeat}: {done}", file=sys.stderr, flush=True)
    return {w: [round(x, 3) for x in runs[w]] for w in WAYS}


def table(result: dict) -> str:
    g, st = result["gbps"], result["settings"]
    cells = [f"{g['reused_gbps']:.2f}"]
    cells += [f"{g[f'{w}_gbps']:.2f} ({g[f'{w}_gbps'] / g['reused_gbps']:.2f}x)" for w in WAYS[1:]]
    return "\n".join(
        [
            f"| chunk | chunks | reused GB/s | fresh GB/s (of reused) | fresh, {st['threads']} "
            "threads GB/s | fresh, huge pages GB/s |",
            "|---|---|---|---|---|---|",
            f"| {st['chunk_bytes']} | {st['chunks']} | " + " | ".join(cells) + " |",
        ]
    )


def main(argv: list[str] | None = None, fresh: bool = False) -> int:
    """``fresh``: every large allocation is fresh memory (:func:`fresh_buffers`), so that
    no round reuses the pages of the buffers an earlier one freed."""
    ap = argparse.ArgumentParser(prog="python -m bench.fresh_copy", description=__doc__)
    ap.add_argument("--chunk-bytes", default="9MiB")
    ap.add_argument("--chunks", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4, help="copy threads of fresh_threads")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--commit", default=None, help="the commit measured (a tree without git)")
    args = ap.parse_args(argv)
    chunk_bytes = parse_size("--chunk-bytes", args.chunk_bytes)
    if chunk_bytes < 4096 or min(args.chunks, args.repeat, args.threads) < 1:
        ap.error("--chunk-bytes must be at least 4KiB; --chunks, --repeat, --threads at least 1")
    settings = {"chunk_bytes": args.chunk_bytes, "chunks": args.chunks, "repeat": args.repeat}
    settings["threads"], settings["fresh"] = args.threads, fresh
    result = {
        "settings": settings,
        "transparent_hugepage": THP.read_text().strip() if THP.exists() else None,
        "rounds_gbps": (rounds := measure(chunk_bytes, args.chunks, args.repeat, args.threads)),
        "gbps": {f"{w}_gbps": round(statistics.median(rounds[w]), 3) for w in WAYS},
        "provenance": provenance(False, args.commit),
    }
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(fresh=fresh_buffers()))
