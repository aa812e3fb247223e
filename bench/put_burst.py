"""A burst of write-through stores longer than the CPU tier, by put-copy threads.

    python -m bench.put_burst [--chunk-bytes 9MiB] [--slots 32] [--chunks 256]
        [--threads 1,4] [--repeat 3] [--json PATH] [--commit SHA]

A prompt longer than the CPU tier is stored whole: each chunk goes into the slot of one
stored before it, and with write-through that slot is stored into again only once the
uploader has copied the earlier chunk for its put (``worker/slot_guard.py``). So such a
burst runs at the put copies' speed, and the copies go into buffers not used before
(``bench.fresh_copy``). Per pass and ``--threads`` value, one rank's uploader
(:class:`~miniflex.remote.uploader.RemoteUploader`, ``copy_threads`` as
``remote_copy_threads``, a new one per pass, so its buffers are fresh) and a host pool of
``--slots`` slots, the CPU tier:

1. ``--chunks`` chunks are stored one after the other into slot ``i % slots``, each once
   its slot's earlier chunk was copied for its put, by ``copy_into`` from one source
   chunk (the gpu-store lane's copy); every 16 (``PUT_GROUP``) are handed to the
   uploader as one group;
2. the puts are held back for the burst, as a rank's puts wait while its loads fetch
   (``fetch_gate.py``), then sent (untimed) to a redis-server of the pass's own, so that
   none is found held already and no buffer is given back for reuse during the burst.

Every copy buffer is fresh memory, as in the first burst past the buffers an uploader has
made (``bench/fresh_memory.py``); the pool's slots are written once before the burst.

Each row: the burst's median time (from the first store until every chunk is stored and
copied for its put), its GB/s, and its speed-up over
one copy thread, measured in the same run, passes interleaved. The ceiling is
``fresh_copy``'s copy into reused buffers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

from bench.fresh_memory import fresh_buffers
from miniflex.bytecopy import copy_into
from miniflex.config.parse import parse_size
from miniflex.pool import HostPool
from miniflex.remote.fetch_gate import FetchGate
from miniflex.remote.local_server import private_store
from miniflex.remote.redis_store import RedisStore
from miniflex.remote.tier import PUT_GROUP
from miniflex.remote.uploader import RemoteUploader
from miniflex.tools.bench.provenance import provenance
from miniflex.tools.bench.report import emit
from miniflex.types import ChunkKey, SlotId

NS = b"put-burst!!!!!!!"


def log(msg: str) -> None:
    print(f"[put_burst] {msg}", file=sys.stderr, flush=True)


def burst(args: argparse.Namespace, threads: int) -> float:
    """Seconds to store ``--chunks`` chunks through ``--slots`` slots with write-through,
    against a redis-server of its own."""
    memory = f"{args.chunks * args.nbytes * 2 // (1 << 30) + 1}gb"  # the chunks, enveloped
    with tempfile.TemporaryDirectory(prefix="miniflex-put-burst-") as tmp:
        server = private_store(tmp, 0, maxmemory=memory).start()
        try:
            return _burst(server.url, args, threads)
        finally:
            server.kill()


def _burst(url: str, args: argparse.Namespace, threads: int) -> float:
    pool = HostPool(args.slots, args.nbytes)
    src = np.frombuffer(os.urandom(args.nbytes), dtype=np.uint8)
    for s in range(args.slots):  # the CPU tier's pages, touched before the burst
        copy_into(pool.slot(SlotId(s)), 0, src)
    gate = FetchGate()
    up = RemoteUploader(
        RedisStore(url, NS, timeout_s=30.0), args.chunks * args.nbytes, gate, threads
    )
    copied = [threading.Event() for _ in range(args.slots)]
    for event in copied:
        event.set()  # nothing in the slots yet
    group: list[int] = []
    try:
        with gate.fetching():  # puts held back, as behind a rank's loads
            t0 = time.perf_counter()
            for i in range(args.chunks):
                slot = i % args.slots
                assert copied[slot].wait(60), "a put copy never ended"
                copy_into(pool.slot(SlotId(slot)), 0, src)
                copied[slot].clear()
                group.append(i)
                if len(group) == PUT_GROUP or i == args.chunks - 1:
                    chunks = [(ChunkKey(c + 1), pool.slot(SlotId(c % args.slots))) for c in group]
                    slots = {c % args.slots for c in group}
                    up.offer_later(chunks, lambda s=slots: [copied[x].set() for x in s])
                    group = []
            for event in copied:
                assert event.wait(60), "a put copy never ended"
            seconds = time.perf_counter() - t0
        assert up.flush(600), "the puts did not end"
        assert up.stats().dropped == 0 and up.stats().failed == 0
    finally:
        up.close()
    return seconds


def measure(args: argparse.Namespace) -> list[dict[str, object]]:
    times: dict[int, list[float]] = {n: [] for n in args.thread_counts}
    for p in range(args.repeat):
        for n in args.thread_counts:  # interleaved, so that drift hits every count alike
            times[n].append(burst(args, n))
            log(f"pass {p} {n} copy threads: {times[n][-1] * 1e3:.1f} ms")
    total = args.chunks * args.nbytes
    base = statistics.median(times[args.thread_counts[0]])
    rows = []
    for n in args.thread_counts:
        s = statistics.median(times[n])
        rows.append(
            {
                "copy_threads": n,
                "burst_ms": round(s * 1e3, 1),
                "store_gbps": round(total / s / 1e9, 3),
                f"vs_{args.thread_counts[0]}_threads": round(base / s, 2),
                "passes_ms": [round(t * 1e3, 1) for t in times[n]],
            }
        )
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.put_burst",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--chunk-bytes", default="9MiB")
    ap.add_argument("--slots", type=int, default=32, help="the CPU tier, in chunks")
    ap.add_argument("--chunks", type=int, default=256, help="chunks stored per burst")
    ap.add_argument("--threads", default="1,4", help="copy threads, comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="passes; the median counts")
    ap.add_argument("--json")
    ap.add_argument("--commit", default=None, help="the commit measured (a tree without git)")
    args = ap.parse_args(argv)
    args.nbytes = parse_size("--chunk-bytes", args.chunk_bytes)
    try:
        args.thread_counts = [int(t) for t in args.threads.split(",")]
    except ValueError:
        ap.error(f"--threads must be comma-separated integers, not {args.threads!r}")
    if min(args.slots, args.chunks, args.repeat, *args.thread_counts) < 1:
        ap.error("--slots, --chunks, --repeat and every --threads value must be at least 1")
    if args.nbytes < 4096 or args.chunks <= args.slots or args.slots < PUT_GROUP:
        ap.error(
            f"--chunk-bytes must be at least 4KiB, --slots at least {PUT_GROUP} (a group of "
            "puts) and --chunks more than --slots"
        )
    return args


def main(argv: list[str] | None = None, fresh: bool = False) -> int:
    """``fresh``: every copy buffer was made fresh memory (:func:`fresh_buffers`)."""
    args = parse_args(argv)
    args.fresh = fresh
    rows = measure(args)
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "commit")}
    extra = {
        "settings": settings,
        "cpus": os.cpu_count(),
        "provenance": provenance(False, args.commit),
    }
    emit("Write-through stores past the CPU tier, by put-copy threads", rows, args.json, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main(fresh=fresh_buffers()))
