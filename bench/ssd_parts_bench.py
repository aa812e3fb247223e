"""SSD reads in layer parts (what an in-step load does) against whole-slot reads, same chunks.

    python -m bench.ssd_parts_bench [--dir DIR] [--chunk-mib 9] [--layers 36] [--chunks 256]

Writes ``--chunks`` chunk slots through MiniFlex's ``SSDStore`` (O_DIRECT, journaled), then
reads them back three ways, best of ``--repeat`` each, and checks the bytes:

- ``raw``: the I/O backend alone, one op per slot, every slot at once (the ceiling: no
  journal, no checksum);
- ``whole``: ``SSDStore.read`` of every slot (an async promotion's read);
- ``parts``: ``SSDStore.read`` in ``--layers`` parts, part ``p`` of every slot in one batch
  (an in-step load's read; each part is one layer of every chunk), with the time until
  the first part was in (what a layerwise load exposes before layer 0 can compute).

Defaults are the 8B shape's chunk: 64 tokens x 144 KiB = 9 MiB in 36 layers of 256 KiB.
Prints a table and one JSON line (``--json`` writes it too); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.ssd_bench import disk_parser, progress
from miniflex.pool import HostPool
from miniflex.ssd import IOOp, SSDStore, make_backend
from miniflex.tools.bench.report import emit
from miniflex.types import ChunkKey, SlotId

MIB = 1 << 20


def timed_read(store: SSDStore, items: list, part_bytes: int) -> tuple[float, float]:
    """(seconds for the read, seconds until its first part was in)."""
    first: list[float] = []
    t0 = time.perf_counter()
    ok, _ = store.read(items, part_bytes, lambda p: first.append(time.perf_counter()))
    seconds = time.perf_counter() - t0
    assert all(ok), "a chunk failed its read"
    return seconds, (first[0] - t0) if first else seconds


def raw_read(store: SSDStore, dst: HostPool, n: int) -> float:
    """Seconds to read every slot with the backend alone (one op per slot, O_DIRECT)."""
    path = store.location(SlotId(0))[0]
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        ops = [
            IOOp(fd, path, store.location(SlotId(s))[1], memoryview(dst.slot(SlotId(s))), False)
            for s in range(n)
        ]
        with make_backend() as io:
            t0 = time.perf_counter()
            io.run(ops)
            return time.perf_counter() - t0
    finally:
        os.close(fd)


def parse_args() -> tuple[argparse.Namespace, int, int]:
    """The options, a slot's bytes and a part's; exits unless both are multiples of 4 KiB."""
    ap = disk_parser(__doc__, repeat=3)
    ap.add_argument("--chunk-mib", type=float, default=9.0, help="one chunk's slot (MiB)")
    ap.add_argument("--layers", type=int, default=36, help="parts a slot is read in")
    ap.add_argument("--chunks", type=int, default=256, help="chunks read at once")
    args = ap.parse_args()
    slot = int(args.chunk_mib * MIB)
    part = slot // args.layers
    if slot % 4096 or part % 4096 or part * args.layers != slot:
        ap.error(f"a {slot}-byte slot in {args.layers} parts: both must be multiples of 4 KiB")
    return args, slot, part


def random_pools(n: int, slot: int) -> tuple[HostPool, HostPool]:
    """(``n`` slots of seeded random bytes to write, ``n`` slots to read them back into)."""
    src, dst = HostPool(n, slot), HostPool(n, slot)
    rng = np.random.default_rng(0)
    for s in range(n):
        src.slot(SlotId(s)).view(np.uint64)[:] = rng.integers(0, 2**63, slot // 8, np.uint64)
    return src, dst


def best_read(
    once: Callable[[], tuple[float, float]], dst: HostPool, repeat: int
) -> tuple[float, float]:
    """The fastest of ``repeat`` runs of ``once``, each into a zeroed ``dst``: (seconds for
    the read, seconds until its first part was in)."""
    best, first = float("inf"), 0.0
    for _ in range(repeat):
        dst.array[:] = 0
        seconds, to_first = once()
        if seconds < best:
            best, first = seconds, to_first
    return best, first


def read_rows(
    store: SSDStore, src: HostPool, dst: HostPool, part: int, repeat: int
) -> list[dict[str, Any]]:
    """Write every slot of ``src`` through ``store``, then read them into ``dst`` each way
    (raw, whole, parts): one row per way, its bytes checked against ``src``."""
    n, slot = src.num_slots, src.slot_bytes
    progress(f"writing {n} chunks of {slot / MIB:.1f} MiB ({n * slot / 2**30:.2f} GiB)")
    keys = [ChunkKey(k + 1) for k in range(n)]
    w = [(keys[s], SlotId(s), memoryview(src.slot(SlotId(s)))) for s in range(n)]
    assert all(store.write(w)), "a chunk failed its write"
    items = [(keys[s], SlotId(s), memoryview(dst.slot(SlotId(s)))) for s in range(n)]
    ways = {
        "raw": lambda: (raw_read(store, dst, n), 0.0),
        "whole": lambda: timed_read(store, items, 0),
        "parts": lambda: timed_read(store, items, part),
    }
    rows = []
    for way, once in ways.items():
        best, first = best_read(once, dst, repeat)
        ok = bool(np.array_equal(src.array[:n], dst.array[:n]))
        progress(f"{way}: {n * slot / best / 1e9:.2f} GB/s, bytes right: {ok}")
        rows.append(
            {
                "read": way,
                "GBps": round(n * slot / best / 1e9, 2),
                "first_part_ms": round(1e3 * first, 1) if way == "parts" else "",
                "verified": ok,
            }
        )
    return rows


def main() -> None:
    args, slot, part = parse_args()
    n = args.chunks
    src, dst = random_pools(n, slot)
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        store = SSDStore([d], n * slot, slot, bytes(16))
        try:
            rows = read_rows(store, src, dst, part, args.repeat)
        finally:
            store.close()
    raw = rows[0]["GBps"]
    for r in rows:
        r["vs_raw"] = round(r["GBps"] / raw, 2)
    extra = {
        "dir": args.dir,
        "chunk_MiB": args.chunk_mib,
        "layers": args.layers,
        "chunks": n,
        "part_KiB": part // 1024,
        "repeat": args.repeat,
    }
    emit(f"SSD reads of {n} chunks, whole and in {args.layers} parts", rows, args.json, extra)
    src.close()
    dst.close()


if __name__ == "__main__":
    main()
