"""Whose ceiling is a remote fetch: the server's sending thread, or the client's interpreter?

    python -m bench.remote_ceiling [--count 48] [--tokens 64] [--repeat 3]
                                   [--clients 1,2,4] [--servers 1,2,4,8] [--json PATH]

Every row fetches ``--count`` chunks of ``--tokens`` tokens of an 8B model (9.4 MB
at 64 tokens) per client with MiniFlex's fetch path (:class:`RemoteFetcher`), best
of ``--repeat`` passes, from private ``redis-server`` processes on this machine:

- ``shared server``: K client processes at once, all from one server;
- ``server each``: K client processes at once, each from a server of its own;
- ``one process, N servers``: one process, one thread and one connection per
  server, its chunks spread over N servers (as a cluster's primaries).

If one server is the ceiling, the shared rows stay flat as K grows while the
``server each`` rows add up; if the client's interpreter is, one process
over N servers stays flat. ``total_GBps`` is every client's bytes over the
pass's time; ``vs_one`` is that against one client on one server. Progress goes
to stderr.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import threading
import time
from typing import Any

from bench.remote_bench import TOKEN_BYTES
from bench.remote_wire import _stage, store_gbps
from miniflex.pool import HostPool
from miniflex.remote.local_server import LocalServer
from miniflex.tools.bench.argtypes import counts
from miniflex.tools.bench.provenance import provenance
from miniflex.tools.bench.report import Progress, emit

progress = Progress("remote-ceiling")


def _pool(count: int, nbytes: int) -> HostPool:
    pool = HostPool(count, nbytes)
    pool.array[:] = 0  # touched once, as a serving pool's slots are
    return pool


def _client(url: str, count: int, nbytes: int, repeat: int, barrier: Any, out: Any) -> None:
    """One client process: ``repeat`` fetch passes, each started with the others."""
    pool = _pool(count, nbytes)
    for _ in range(repeat):
        barrier.wait()
        t0 = time.perf_counter()
        store_gbps(url, pool, count, 1)
        out.put(time.perf_counter() - t0)


def processes(urls: list[str], args: argparse.Namespace, nbytes: int) -> float:
    """Total GB/s of one client process per URL, fetching at once (best pass)."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(len(urls)), ctx.Queue()
    procs = [
        ctx.Process(target=_client, args=(u, args.count, nbytes, args.repeat, barrier, out))
        for u in urls
    ]
    for p in procs:
        p.start()
    times = [out.get(timeout=600) for _ in range(len(urls) * args.repeat)]
    for p in procs:
        p.join()
    slowest = [max(times[i * len(urls) : (i + 1) * len(urls)]) for i in range(args.repeat)]
    return len(urls) * args.count * nbytes / min(slowest) / 1e9


def threads(urls: list[str], args: argparse.Namespace, nbytes: int) -> float:
    """Total GB/s of one process, one thread and connection per URL, at once (best pass)."""
    pools = [_pool(args.count, nbytes) for _ in urls]
    best = 0.0
    for _ in range(args.repeat):
        start = threading.Barrier(len(urls) + 1)

        def fetch(i: int, start: threading.Barrier = start) -> None:
            start.wait()
            store_gbps(urls[i], pools[i], args.count, 1)

        workers = [threading.Thread(target=fetch, args=(i,)) for i in range(len(urls))]
        for w in workers:
            w.start()
        start.wait()
        t0 = time.perf_counter()
        for w in workers:
            w.join()
        best = max(best, len(urls) * args.count * nbytes / (time.perf_counter() - t0) / 1e9)
    for pool in pools:
        pool.close()
    return best


def measure(args: argparse.Namespace, tmp: str) -> list[dict[str, object]]:
    nbytes = args.tokens * TOKEN_BYTES
    data = os.urandom(nbytes)
    most = max(max(args.clients), max(args.servers))
    servers = [LocalServer(f"{tmp}/s{i}", maxmemory="4gb").start() for i in range(most)]
    try:
        for s in servers:
            _stage(s.url, data, args.count, plain=False)
        urls = [s.url for s in servers]
        runs: list[tuple[str, int, int, float]] = []
        for k in args.clients:
            runs.append(("shared server", k, 1, processes([urls[0]] * k, args, nbytes)))
            if k > 1:
                runs.append(("server each", k, k, processes(urls[:k], args, nbytes)))
        for n in args.servers:
            runs.append((f"one process, {n} servers", 1, n, threads(urls[:n], args, nbytes)))
        for mode, k, n, gbps in runs:
            progress(f"{mode}: {k} client(s), {n} server(s): {gbps:.2f} GB/s")
    finally:
        for s in servers:
            s.kill()
    one = next(g for m, k, n, g in runs if k == 1 and n == 1)
    return [
        {
            "mode": mode,
            "clients": k,
            "servers": n,
            "total_GBps": round(gbps, 2),
            "per_client_GBps": round(gbps / k, 2),
            "vs_one": round(gbps / one, 2),
        }
        for mode, k, n, gbps in runs
    ]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, default=64, help="tokens per chunk (144 KiB each)")
    ap.add_argument("--count", type=int, default=48, help="chunks per client and pass")
    ap.add_argument("--repeat", type=int, default=3, help="passes; the best counts")
    ap.add_argument("--clients", type=counts, default=(1, 2, 4), help="client processes")
    ap.add_argument("--servers", type=counts, default=(1, 2, 4, 8), help="one process's servers")
    ap.add_argument("--json")
    ap.add_argument("--commit", default=None, help="the commit measured (a tree without git)")
    args = ap.parse_args()
    if min(args.tokens, args.count, args.repeat) < 1:
        ap.error("--tokens, --count and --repeat must be at least 1")
    with tempfile.TemporaryDirectory(prefix="miniflex-remote-ceiling-") as tmp:
        rows = measure(args, tmp)
    extra = {**vars(args), "cpus": os.cpu_count(), "provenance": provenance(False, args.commit)}
    emit(
        "Remote fetch: one server's thread against the client's interpreter", rows, args.json, extra
    )


if __name__ == "__main__":
    main()
