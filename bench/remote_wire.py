"""The remote fetch path against loopback TCP and a plain reader, idle and beside busy Python.

    python -m bench.remote_wire [--url redis://HOST:PORT] [--tokens 64] [--count 48]
                                [--streams 4] [--repeat 3] [--io-threads 1]
                                [--server redis-server|valkey-server] [--cluster N]
                                [--json PATH]

Rows, each ``--count`` chunks of ``--tokens`` tokens of an 8B model (144 KiB a
token; 64 tokens are 9.4 MB), into a pool of as many slots, on the same
machine as the server:

- ``loopback TCP, N streams``: another process sends the same bytes over N
  TCP connections to 127.0.0.1 and this one receives them into the slots
  (``MSG_WAITALL``): the ceiling of any client on this host's loopback;
- ``plain reader``: a minimal client on one connection: ``GET`` of each chunk
  stored as one string, the reply's length line parsed, then ``recv_into`` the
  slot until it is full; no header, no checksum;
- ``miniflex get_into``: :meth:`RedisStore.get_into`, one chunk per call;
- ``miniflex fetch, N streams``: a load's fetches as the tier runs them
  (:class:`~miniflex.remote.fetch.RemoteFetcher` with ``remote_fetch_streams``
  N): header, shape and CRC32C checked, parts read straight into the slots;
- ``busy``: the same beside a thread that runs Python without ever blocking,
  as vLLM's engine thread does while a request waits for its KV.

Ratios: ``vs_plain`` (against the plain reader, same interpreter state),
``vs_tcp`` (against loopback TCP with as many streams), ``busy_vs_idle``.
Every fetched slot is compared with what was put, outside the timing. Best of
``--repeat`` passes, rows interleaved. Without ``--url`` a private
``redis-server`` is started and stopped; ``--cluster N`` starts a private
cluster of N primaries instead (the chunks spread over them by slot; the
plain reader and ``get_into`` rows, one server's paths, are left out).
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import redis

from bench.remote_bench import TOKEN_BYTES, BusyInterpreter
from miniflex.plan import RemoteCopy
from miniflex.pool import HostPool
from miniflex.remote.fetch import RemoteFetcher
from miniflex.remote.local_server import SERVER_BINARIES, private_store
from miniflex.remote.redis_store import RedisStore
from miniflex.tools.bench.argtypes import primaries
from miniflex.tools.bench.provenance import provenance
from miniflex.tools.bench.report import Progress, emit
from miniflex.types import ChunkKey, SlotId

progress = Progress("remote-wire")
NS = b"wire-bench-ns!!!"
_SENDER = """
import socket, sys
port, streams, nbytes, count = map(int, sys.argv[1:])
data = bytes(nbytes)
socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(streams)]
for i in range(count):
    socks[i % streams].sendall(data)
for s in socks:
    s.close()
"""


def tcp_gbps(pool: HostPool, count: int, streams: int) -> float:
    """Loopback TCP: another process sends ``count`` slots' bytes over ``streams`` connections."""
    nbytes = pool.slot_bytes
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        args = [sys.executable, "-c", _SENDER, str(port), str(streams), str(nbytes), str(count)]
        sender = subprocess.Popen(args)
        conns = [server.accept()[0] for _ in range(streams)]
        t0 = time.perf_counter()

        def receive(s: int) -> None:
            for i in range(s, count, streams):
                view = memoryview(pool.slot(SlotId(i))).cast("B")
                while view:
                    view = view[conns[s].recv_into(view, len(view), socket.MSG_WAITALL) :]

        threads = [threading.Thread(target=receive, args=(s,)) for s in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - t0
        sender.wait()
        for c in conns:
            c.close()
    return nbytes * count / seconds / 1e9


def plain_gbps(url: str, pool: HostPool, data: bytes, count: int) -> float:
    """A minimal RESP reader: GET each chunk (one string each) straight into its slot."""
    host, port = url.removeprefix("redis://").split(":")
    sock = socket.create_connection((host, int(port)))
    t0 = time.perf_counter()
    for i in range(count):
        sock.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\nplain:%d\r\n" % (len(b"plain:%d" % i), i))
        head = b""
        while not head.endswith(b"\r\n"):
            head += sock.recv(1)  # the length line, a byte at a time: nothing of the payload
        size = int(head[1:-2])
        view = memoryview(pool.slot(SlotId(i))).cast("B")[:size]
        while view:
            view = view[sock.recv_into(view) :]
        assert sock.recv(2, socket.MSG_WAITALL) == b"\r\n"
    seconds = time.perf_counter() - t0
    sock.close()
    return len(data) * count / seconds / 1e9


def store_gbps(url: str, pool: HostPool, count: int, streams: int | None) -> float:
    """RedisStore: ``get_into`` one at a time (``streams`` None), or a load's fetch."""
    store = RedisStore(url, NS, timeout_s=10.0)
    copies = [RemoteCopy(ChunkKey(i + 1), SlotId(i)) for i in range(count)]
    try:
        if streams is None:
            t0 = time.perf_counter()
            for c in copies:
                got = store.get_into(c.key, memoryview(pool.slot(c.cpu)).cast("B"))
                assert got == pool.slot_bytes, "a fetch failed"
            seconds = time.perf_counter() - t0
        else:
            fetcher = RemoteFetcher(store, pool, streams)
            failed, seconds = fetcher.fetch(copies)
            fetcher.close()
            assert not failed, f"{len(failed)} fetches failed"
    finally:
        store.close()
    return pool.slot_bytes * count / seconds / 1e9


def _stage(url: str, data: bytes, count: int, plain: bool = True) -> None:
    """Put the chunks (MiniFlex's envelope) and, on one server, the plain reader's strings."""
    store = RedisStore(url, NS, timeout_s=10.0)
    for i in range(count):
        assert store.put(ChunkKey(i + 1), data), "a put failed"
    store.close()
    if plain:
        raw = redis.Redis.from_url(url, protocol=2)
        for i in range(count):
            raw.set(f"plain:{i}", data)
        raw.close()


def measure(url: str, args: argparse.Namespace) -> list[dict[str, object]]:
    nbytes = args.tokens * TOKEN_BYTES
    data = os.urandom(nbytes)
    _stage(url, data, args.count, plain=not args.cluster)
    pool = HostPool(args.count, nbytes)
    pool.array[:] = 0  # touched once, as a serving pool's slots are
    n = args.streams
    runs: dict[str, Callable[[], float]] = {
        "loopback TCP, 1 stream": lambda: tcp_gbps(pool, args.count, 1),
        f"loopback TCP, {n} streams": lambda: tcp_gbps(pool, args.count, n),
        "plain reader": lambda: plain_gbps(url, pool, data, args.count),
        "miniflex get_into": lambda: store_gbps(url, pool, args.count, None),
        "miniflex fetch, 1 stream": lambda: store_gbps(url, pool, args.count, 1),
        f"miniflex fetch, {n} streams": lambda: store_gbps(url, pool, args.count, n),
    }
    if args.cluster:  # one server's paths: no plain reader over a cluster
        del runs["plain reader"], runs["miniflex get_into"]
    best: dict[tuple[str, bool], float] = {}
    for rep in range(args.repeat):
        for busy in (False, True):
            for name, run in runs.items():
                with BusyInterpreter() if busy else _Idle():
                    gbps = run()
                if not name.startswith("loopback"):
                    assert all(pool.slot(SlotId(i)).tobytes() == data for i in range(args.count))
                pool.array[:] = 0
                progress(f"pass {rep + 1}{' busy' if busy else ''}: {name} {gbps:.2f} GB/s")
                best[name, busy] = max(best.get((name, busy), 0.0), gbps)
    pool.close()
    return _rows(best, n, nbytes)


def _rows(best: dict[tuple[str, bool], float], n: int, nbytes: int) -> list[dict[str, object]]:
    rows = []
    for (name, busy), gbps in best.items():
        streams = n if name.endswith(f"{n} streams") else 1
        tcp = best[
            (f"loopback TCP, {n} streams" if streams > 1 else "loopback TCP, 1 stream"), False
        ]
        idle = best[name, False]
        plain = best.get(("plain reader", busy))
        rows.append(
            {
                "chunk_MB": round(nbytes / 1e6, 2),
                "client": name,
                "interpreter": "busy" if busy else "idle",
                "GBps": round(gbps, 2),
                "vs_plain": round(gbps / plain, 2) if plain else None,
                "vs_tcp": round(gbps / tcp, 2),
                "busy_vs_idle": round(gbps / idle, 2) if busy else None,
            }
        )
    return rows


class _Idle:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", help="an existing server (default: start a private one)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per chunk (144 KiB each)")
    ap.add_argument("--count", type=int, default=48, help="chunks per pass")
    ap.add_argument("--streams", type=int, default=4, help="connections of the N-stream rows")
    ap.add_argument("--repeat", type=int, default=3, help="passes; the best counts")
    ap.add_argument(
        "--io-threads", type=int, default=1, help="the private server's io-threads (1: none)"
    )
    ap.add_argument(
        "--server", choices=SERVER_BINARIES, default=None, help="the private server's binary"
    )
    ap.add_argument(
        "--cluster", type=primaries, default=0, help="a private cluster of this many primaries"
    )
    ap.add_argument("--json")
    ap.add_argument("--commit", default=None, help="the commit measured (a tree without git)")
    args = ap.parse_args()
    if min(args.tokens, args.count, args.repeat, args.io_threads) < 1 or args.streams < 2:
        ap.error("--tokens, --count, --repeat, --io-threads must be at least 1, --streams 2")
    if args.url and (args.io_threads > 1 or args.server or args.cluster):
        ap.error("--io-threads, --server and --cluster start a private server: not with --url")
    with tempfile.TemporaryDirectory(prefix="miniflex-remote-wire-") as tmp:
        server = None
        if not args.url:
            options = {"maxmemory": "4gb", "io_threads": args.io_threads, "binary": args.server}
            server = private_store(tmp, args.cluster, **options).start()
        url = args.url or server.url  # type: ignore[union-attr]
        try:
            rows = measure(url, args)
        finally:
            if server is not None:
                server.kill()
    extra = {
        **vars(args),
        "url": url,
        "cpus": os.cpu_count(),
        "provenance": provenance(False, args.commit),
    }
    emit("Remote fetch path against loopback TCP and a plain reader", rows, args.json, extra)


if __name__ == "__main__":
    main()
