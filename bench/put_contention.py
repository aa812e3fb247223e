"""A load's fetch beside the same rank's write-through puts, with and without loads first.

    python -m bench.put_contention [--tokens 64] [--count 48] [--puts 48] [--streams 4]
        [--repeat 3] [--json PATH]

One private redis-server holds ``--count`` chunks (Qwen3-8B-shaped, 144 KiB a token,
``--tokens`` a chunk). Per pass, one rank's :class:`RemoteFetcher` fetches them all on
``--streams`` connections into a host pool:

- **alone**: nothing else talks to the store;
- **beside puts**: just before the fetch, the rank's uploader was handed ``--puts``
  fresh chunks (a prompt it had just computed, written through); its put thread sends
  them while the fetch runs;
- **loads first**: the same, with the uploader waiting for the rank's fetches
  (:mod:`miniflex.remote.fetch_gate`, what MiniFlex does with write-through).

Each row: the fetch's median time over the passes, its GB/s, the ratio to the fetch
alone, and when the puts were all acknowledged (from the hand-over). Everything runs
in this process, as in a worker: the puts' and fetches' threads share the interpreter.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from bench.remote_bench import TOKEN_BYTES
from miniflex.plan import RemoteCopy
from miniflex.pool import HostPool
from miniflex.remote.fetch import RemoteFetcher
from miniflex.remote.local_server import private_store
from miniflex.remote.redis_store import RedisStore
from miniflex.remote.uploader import RemoteUploader
from miniflex.tools.bench.provenance import provenance
from miniflex.tools.bench.report import emit
from miniflex.types import ChunkKey, SlotId

NS = b"put-contention!!"
MODES = ("alone", "beside puts", "loads first")


def log(msg: str) -> None:
    print(f"[put_contention] {msg}", file=sys.stderr, flush=True)


def one_pass(url: str, args: argparse.Namespace, mode: str, pass_no: int) -> tuple[float, float]:
    """One fetch of every staged chunk in ``mode``: (fetch seconds, puts-done seconds)."""
    nbytes = args.tokens * TOKEN_BYTES
    pool = HostPool(args.count, nbytes)
    store, put_store = RedisStore(url, NS, timeout_s=10.0), RedisStore(url, NS, timeout_s=10.0)
    fetcher = RemoteFetcher(store, pool, args.streams)
    gate = fetcher.gate if mode == "loads first" else None
    up = RemoteUploader(put_store, max_bytes=(args.puts + 1) * nbytes, gate=gate)
    copies = [RemoteCopy(ChunkKey(i + 1), SlotId(i)) for i in range(args.count)]
    try:
        t0 = time.perf_counter()
        if mode != "alone":
            first = 1_000_000 * (pass_no + 1) + 10_000 * MODES.index(mode)
            data = np.frombuffer(os.urandom(nbytes), dtype=np.uint8)
            for i in range(args.puts):
                assert up.offer(ChunkKey(first + i), data), "the backlog is too small"
        failed, fetch_s = fetcher.fetch(copies)
        assert not failed, f"{len(failed)} fetches failed"
        assert up.flush(120), "the puts did not end"
        puts_s = time.perf_counter() - t0
        assert up.take_outcome().acked == (0 if mode == "alone" else args.puts)
    finally:
        up.close()
        fetcher.close()
        store.close()
    return fetch_s, puts_s


def measure(url: str, args: argparse.Namespace) -> list[dict[str, object]]:
    nbytes = args.tokens * TOKEN_BYTES
    stage = RedisStore(url, NS, timeout_s=10.0)
    data = os.urandom(nbytes)
    for i in range(args.count):
        assert stage.put(ChunkKey(i + 1), data), "a put failed"
    stage.close()
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    for p in range(args.repeat):
        for mode in MODES:  # interleaved, so that drift hits every mode alike
            times[mode].append(one_pass(url, args, mode, p))
            log(f"pass {p} {mode}: fetch {times[mode][-1][0] * 1e3:.1f} ms")
    alone = statistics.median(f for f, _ in times["alone"])
    rows = []
    for mode in MODES:
        fetch = statistics.median(f for f, _ in times[mode])
        rows.append(
            {
                "mode": mode,
                "fetch_ms": round(fetch * 1e3, 1),
                "fetch_gbps": round(nbytes * args.count / fetch / 1e9, 3),
                "vs_alone": round(fetch / alone, 2),
                "puts_done_ms": None
                if mode == "alone"
                else round(statistics.median(p for _, p in times[mode]) * 1e3, 1),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, default=64, help="tokens per chunk (144 KiB each)")
    ap.add_argument("--count", type=int, default=48, help="chunks fetched per pass")
    ap.add_argument("--puts", type=int, default=48, help="chunks handed to the puts per pass")
    ap.add_argument("--streams", type=int, default=4, help="the fetch's connections")
    ap.add_argument("--repeat", type=int, default=3, help="passes; the median counts")
    ap.add_argument("--json")
    ap.add_argument("--commit", default=None, help="the commit measured (a tree without git)")
    args = ap.parse_args()
    if min(args.tokens, args.count, args.puts, args.streams, args.repeat) < 1:
        ap.error("--tokens, --count, --puts, --streams and --repeat must be at least 1")
    # the staged chunks and every pass's puts (fresh keys each), with room for the envelopes
    need = (args.count + args.puts * (len(MODES) - 1) * args.repeat) * args.tokens * TOKEN_BYTES
    with tempfile.TemporaryDirectory(prefix="miniflex-put-contention-") as tmp:
        memory = f"{need // (1 << 30) + 1}gb"
        server = private_store(tmp, 0, maxmemory=memory).start()
        try:
            rows = measure(server.url, args)
        finally:
            server.kill()
    extra = {**vars(args), "cpus": os.cpu_count(), "provenance": provenance(False, args.commit)}
    emit("A fetch beside the same rank's write-through puts", rows, args.json, extra)


if __name__ == "__main__":
    main()
