"""Bandwidth of MiniFlex's remote store against the store's own client benchmark.

    python -m bench.remote_bench [--url redis://HOST:PORT] [--tokens 16 64] [--mib 8]
                                 [--count 32] [--repeat 3] [--part-mib 2] [--streams 4]
                                 [--json PATH]

For each value size (``--tokens`` tokens of an 8B model's 144 KiB each, 64
tokens being 9.4 MB, and ``--mib`` MiB), one call at a time on one connection
unless a row says otherwise:

- ``redis-benchmark`` SET and GET of a value of that size (``-c 1``, one key
  overwritten ``--count`` times): the store's own client benchmark, the
  reference of the ratios;
- ``redis-benchmark, part-size values``: the same with values of
  ``--part-mib``, the size of the fields MiniFlex stores;
- ``redis-py``: the same through the Python client MiniFlex uses, one
  string per chunk (``SET`` / ``GET``), with no header, checksum or parts;
- ``miniflex``: :class:`~miniflex.remote.redis_store.RedisStore` ``put`` and
  ``get_into`` (into one reused buffer, as the tier fetches into a CPU slot)
  of ``--count`` distinct chunks: header, CRC32 both ways, the chunk in fields
  of ``--part-mib``; every read is checked byte for byte, outside the timing;
- ``miniflex get()``: the same with ``get``, which returns a new ``bytes``;
- ``miniflex fetch, N streams``: a load's fetches as the tier runs them
  (:class:`~miniflex.remote.fetch.RemoteFetcher`, ``remote_fetch_streams`` N,
  ``--streams``): the ``--count`` chunks into as many CPU-pool slots, N at once,
  each checked afterwards; its puts are the ``miniflex`` row's, one at a time.
- ``busy interpreter`` rows: the ``redis-py`` row (at the client's default
  64 KiB socket read size) and a 1-stream fetch while another thread runs
  Python without blocking, as vLLM's engine thread does while a request waits
  for its KV.

``put_vs_cli`` and ``get_vs_cli`` are MiniFlex's GB/s over redis-benchmark's.
Best of ``--repeat`` passes, interleaved so that a busy machine slows all
rows alike. Without ``--url`` a private ``redis-server`` is started on a free
port (no persistence) and stopped at the end. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import numpy as np
import redis

from miniflex.plan import RemoteCopy
from miniflex.pool import HostPool
from miniflex.remote.fetch import RemoteFetcher
from miniflex.remote.local_server import LocalServer
from miniflex.remote.redis_store import RedisStore
from miniflex.tools.bench.provenance import provenance
from miniflex.tools.bench.report import Progress, emit
from miniflex.types import ChunkKey, SlotId

TOKEN_BYTES = 144 * 1024
"""KV bytes per token of an 8B model (36 layers x 8 KV heads x 128 x 2 x bf16)."""
MIB = 1 << 20
progress = Progress("remote")


def cli_gbps(url: str, nbytes: int, count: int) -> dict[str, float]:
    """redis-benchmark's SET and GET GB/s for ``count`` values of ``nbytes`` on one connection."""
    parts = urlsplit(url)
    cmd = ["redis-benchmark", "-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 6379)]
    cmd += ["-t", "set,get", "-d", str(nbytes), "-n", str(count), "-c", "1", "--csv"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rps = {}
    for line in out.splitlines():
        cells = [c.strip('"') for c in line.split(",")]
        if cells[0] in ("SET", "GET"):
            rps[cells[0]] = float(cells[1])
    return {"put": rps["SET"] * nbytes / 1e9, "get": rps["GET"] * nbytes / 1e9}


def _timed(call: Callable[[], object]) -> tuple[object, float]:
    t0 = time.perf_counter()
    out = call()
    return out, time.perf_counter() - t0


def _loop_gbps(
    nbytes: int, count: int, put: Callable[[int], float], get: Callable[[int], float]
) -> dict[str, float]:
    """GB/s of ``count`` puts then ``count`` gets, each returning the seconds of its call alone."""
    put_s = sum(put(i) for i in range(count))
    get_s = sum(get(i) for i in range(count))
    total = nbytes * count
    return {"put": total / put_s / 1e9, "get": total / get_s / 1e9}


def client_gbps(url: str, data: bytes, count: int) -> dict[str, float]:
    """The Python client alone: one string per value, SET then GET."""
    client = redis.Redis.from_url(url, protocol=2)
    names = [f"bench:raw:{i}" for i in range(count)]

    def put(i: int) -> float:
        return _timed(lambda: client.set(names[i], data))[1]

    def get(i: int) -> float:
        got, seconds = _timed(lambda: client.get(names[i]))
        assert got == data, "a value came back wrong"
        return seconds

    try:
        return _loop_gbps(len(data), count, put, get)
    finally:
        client.delete(*names)
        client.close()


def miniflex_gbps(
    url: str, data: bytes, count: int, part_bytes: int, into: bool
) -> dict[str, float]:
    """RedisStore put and get of ``count`` distinct chunks, each read checked (untimed).

    ``into``: ``get_into`` a reused buffer (a CPU slot, as the tier reads); else
    ``get``, which returns a new ``bytes`` per chunk.
    """
    store = RedisStore(url, b"bench-namespace!", timeout_s=10.0, part_bytes=part_bytes)
    keys = [ChunkKey(i + 1) for i in range(count)]
    slot = np.zeros(len(data), dtype=np.uint8)  # touched once, like a pinned pool's slot

    def put(i: int) -> float:
        ok, seconds = _timed(lambda: store.put(keys[i], data))
        assert ok, "a put failed"
        return seconds

    def get(i: int) -> float:
        if into:
            n, seconds = _timed(lambda: store.get_into(keys[i], memoryview(slot)))
            assert n == len(data) and slot.tobytes() == data, "a chunk came back wrong"
        else:
            got, seconds = _timed(lambda: store.get(keys[i]))
            assert got == data, "a chunk came back wrong"
        return seconds

    try:
        return _loop_gbps(len(data), count, put, get)
    finally:
        for key in keys:
            store.delete(key)
        store.close()


class BusyInterpreter:
    """A thread that runs Python without ever blocking, as vLLM's engine thread does while a
    request waits for its KV: every other thread waits for the interpreter lock."""

    def __enter__(self) -> BusyInterpreter:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()
        return self

    def _spin(self) -> None:
        while not self._stop.is_set():
            sum(range(1000))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def busy(run: Callable[[], dict[str, float]]) -> dict[str, float]:
    """``run()`` beside a :class:`BusyInterpreter`."""
    with BusyInterpreter():
        return run()


def fetch_gbps(
    url: str, data: bytes, count: int, part: int, streams: int, busy: bool = False
) -> dict[str, float]:
    """A load's fetch of ``count`` distinct chunks into a CPU pool, ``streams`` at once
    (``busy``: beside a :class:`BusyInterpreter`)."""
    store = RedisStore(url, b"bench-namespace!", timeout_s=10.0, part_bytes=part)
    pool = HostPool(count, len(data))
    pool.array[:] = 0  # touched once, as a serving pool's slots are (no first-touch faults)
    copies = [RemoteCopy(ChunkKey(i + 1), SlotId(i)) for i in range(count)]
    put_s = sum(_timed(lambda c=c: store.put(c.key, data))[1] for c in copies)
    fetcher = RemoteFetcher(store, pool, streams)
    try:
        with BusyInterpreter() if busy else contextlib.nullcontext():
            failed, get_s = fetcher.fetch(copies)
        assert not failed and all(pool.slot(c.cpu).tobytes() == data for c in copies)
        return {"put": len(data) * count / put_s / 1e9, "get": len(data) * count / get_s / 1e9}
    finally:
        fetcher.close()
        for c in copies:
            store.delete(c.key)
        store.close()
        pool.close()


def measure(url: str, nbytes: int, args: argparse.Namespace) -> list[dict[str, object]]:
    data = os.urandom(nbytes)
    part = int(args.part_mib * MIB)
    best: dict[str, dict[str, float]] = {}
    runs = {
        "redis-benchmark": lambda: cli_gbps(url, nbytes, args.count),
        "redis-benchmark, part-size values": lambda: cli_gbps(url, part, args.count),
        "redis-py": lambda: client_gbps(url, data, args.count),
        "miniflex": lambda: miniflex_gbps(url, data, args.count, part, True),
        "miniflex get()": lambda: miniflex_gbps(url, data, args.count, part, False),
        **{
            f"miniflex fetch, {n} streams": lambda n=n: fetch_gbps(url, data, args.count, part, n)
            for n in args.streams
        },
        "redis-py, busy interpreter": lambda: busy(lambda: client_gbps(url, data, args.count)),
        "miniflex fetch, 1 stream, busy interpreter": lambda: fetch_gbps(
            url, data, args.count, part, 1, busy=True
        ),
    }
    for rep in range(args.repeat):
        for name, run in runs.items():
            got = run()
            progress(f"{nbytes} B, pass {rep + 1}: {name} {got}")
            prev = best.setdefault(name, got)
            best[name] = {k: max(prev[k], got[k]) for k in got}
    cli = best["redis-benchmark"]
    rows: list[dict[str, object]] = []
    for name, got in best.items():
        rows.append(
            {
                "chunk_MB": round(nbytes / 1e6, 2),
                "client": name,
                "put_GBps": round(got["put"], 2),
                "get_GBps": round(got["get"], 2),
                "put_vs_cli": round(got["put"] / cli["put"], 2),
                "get_vs_cli": round(got["get"] / cli["get"], 2),
            }
        )
    return rows


def _server_info(url: str) -> dict[str, object]:
    client = redis.Redis.from_url(url, protocol=2)
    info = {**client.info("server"), **client.info("memory")}
    client.close()
    return {k: info.get(k) for k in ("redis_version", "valkey_version", "mem_allocator")}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", help="an existing server (default: start a private one)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[16, 64], help="chunk sizes")
    ap.add_argument("--mib", type=float, nargs="*", default=[8.0], help="more value sizes")
    ap.add_argument("--count", type=int, default=32, help="values per pass")
    ap.add_argument("--repeat", type=int, default=3, help="passes; the best counts")
    ap.add_argument("--part-mib", type=float, default=2.0, help="MiniFlex's part size (MiB)")
    ap.add_argument("--streams", type=int, nargs="*", default=[4], help="fetches at once")
    ap.add_argument("--json")
    args = ap.parse_args()
    assert shutil.which("redis-benchmark"), "redis-benchmark is missing (apt install redis-tools)"
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="miniflex-remote-bench-") as tmp:
        server = None if args.url else LocalServer(tmp, maxmemory="2gb").start()
        url = args.url or server.url  # type: ignore[union-attr]
        try:
            sizes = [t * TOKEN_BYTES for t in args.tokens] + [int(m * MIB) for m in args.mib]
            rows = [row for nbytes in sizes for row in measure(url, nbytes, args)]
            extra = {**vars(args), "url": url}
            extra.update(_server_info(url), hiredis=_has_hiredis(), cpus=os.cpu_count())
            extra.update(loadavg_before=load_before, loadavg_after=os.getloadavg())
            extra["provenance"] = provenance(False)
        finally:
            if server is not None:
                server.kill()
    emit("Remote store bandwidth against redis-benchmark", rows, args.json, extra)


def _has_hiredis() -> bool:
    try:
        import hiredis  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
