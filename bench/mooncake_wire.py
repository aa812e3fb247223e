"""Mooncake Store's fetch path beside the Redis ones, on the same machine, in one run.

    python -m bench.mooncake_wire [--tokens 64] [--count 48] [--repeat 3] [--json PATH]

Needs Mooncake's wheel (``pip install mooncake-transfer-engine-non-cuda`` on a
machine without CUDA, ``mooncake-transfer-engine`` with it) and ``libibverbs1``
(``apt-get install libibverbs1``; its TCP transport loads it even without RDMA).
Starts a private ``mooncake_master`` (HTTP metadata, no etcd), a holder process
that mounts a segment of its own and puts ``--count`` chunks of ``--tokens``
tokens of an 8B model (144 KiB a token) twice, as plain values and through
MiniFlex's ``MooncakeStore`` (its envelope and key names), and a private
``redis-server`` with the same chunks. This process then reads them into a pool
of as many slots:

- ``loopback TCP, 1 stream``: the ceiling of one connection on this host;
- ``plain reader`` and ``miniflex fetch, N streams``: the Redis paths of
  ``bench.remote_wire``;
- ``mooncake get_into``: ``MooncakeDistributedStore.get_into`` of each chunk,
  one at a time, into the registered pool (the bytes cross TCP from the
  holder's segment: this process mounts almost nothing);
- ``mooncake batch_get_into, N``: N chunks per call;
- ``miniflex mooncake fetch, N streams``: what the remote tier pays on Mooncake
  (``bench.mooncake_rows``): ``RemoteFetcher`` over MiniFlex's ``MooncakeStore``,
  each stream one ``get_many_into`` (``batch_get_into`` of 32 MiB windows into
  staging buffers, then header and CRC checked and the payload copied into the
  slot). Its store is set up and its staging buffers filled by one untimed
  fetch first, as a serving tier's are.

Ratios against the plain reader and loopback TCP. Every slot is compared with
what was put, outside the timing. Best of ``--repeat``, rows interleaved.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import mooncake_rows
from bench.remote_bench import TOKEN_BYTES
from bench.remote_wire import _stage, plain_gbps, store_gbps, tcp_gbps
from miniflex.pool import HostPool
from miniflex.remote.local_server import free_port, private_store
from miniflex.tools.bench.provenance import provenance
from miniflex.tools.bench.report import Progress, emit
from miniflex.types import SlotId

progress = Progress("mooncake-wire")
HOLDER_SEGMENT = 4 << 30
READER_SEGMENT = 16 << 20


def _client(master: int, metadata: int, segment: int) -> Any:
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup(
        "127.0.0.1",
        f"http://127.0.0.1:{metadata}/metadata",
        segment,
        64 << 20,
        "tcp",
        "",
        f"127.0.0.1:{master}",
    )
    if rc != 0:
        raise RuntimeError(f"Mooncake setup failed ({rc})")
    return store


def _data(nbytes: int) -> bytes:
    import random

    return random.Random(nbytes).randbytes(nbytes)


def hold(master: int, metadata: int, nbytes: int, count: int) -> None:
    """The holder process: put the chunks into its own segment (plain, then through
    MiniFlex's store: the only segment mounted yet), say so, wait for stdin."""
    store = _client(master, metadata, HOLDER_SEGMENT)
    data = _data(nbytes)
    for i in range(count):
        if store.put(f"c{i}", data) != 0:
            raise RuntimeError(f"Mooncake put of chunk {i} failed")
    mooncake_rows.stage(mooncake_rows.mooncake_url(master, metadata), data, count)
    print("ready", flush=True)
    sys.stdin.read()
    store.close()


def mooncake_gbps(store: Any, pool: HostPool, count: int, batch: int) -> float:
    base, nbytes = pool.array.ctypes.data, pool.slot_bytes
    keys = [f"c{i}" for i in range(count)]
    t0 = time.perf_counter()
    for j in range(0, count, batch):
        part = keys[j : j + batch]
        ptrs = [base + (j + k) * nbytes for k in range(len(part))]
        if batch == 1:
            got = [store.get_into(part[0], ptrs[0], nbytes)]
        else:
            got = store.batch_get_into(part, ptrs, [nbytes] * len(part))
        if any(g != nbytes for g in got):
            raise RuntimeError(f"Mooncake get of {part} returned {got}")
    return nbytes * count / (time.perf_counter() - t0) / 1e9


def measure(args: argparse.Namespace, master: int, metadata: int, url: str) -> list[dict]:
    nbytes = args.tokens * TOKEN_BYTES
    data = _data(nbytes)
    _stage(url, data, args.count)
    pool = HostPool(args.count, nbytes)
    pool.array[:] = 0
    store = _client(master, metadata, READER_SEGMENT)
    if store.register_buffer(pool.array.ctypes.data, pool.array.nbytes) != 0:
        raise RuntimeError("Mooncake could not register the pool")
    ours = mooncake_rows.open_store(mooncake_rows.mooncake_url(master, metadata))
    mooncake_rows.fetch_gbps(ours, pool, args.count, args.streams)  # untimed: set-up
    pool.array[:] = 0
    n, s = args.batch, args.streams
    runs: dict[str, Callable[[], float]] = {
        "loopback TCP, 1 stream": lambda: tcp_gbps(pool, args.count, 1),
        "plain reader": lambda: plain_gbps(url, pool, data, args.count),
        f"miniflex fetch, {s} streams": lambda: store_gbps(url, pool, args.count, s),
        "mooncake get_into": lambda: mooncake_gbps(store, pool, args.count, 1),
        f"mooncake batch_get_into, {n}": lambda: mooncake_gbps(store, pool, args.count, n),
        f"miniflex mooncake fetch, {s} streams": lambda: mooncake_rows.fetch_gbps(
            ours, pool, args.count, s
        ),
    }
    best: dict[str, float] = {}
    for rep in range(args.repeat):
        for name, run in runs.items():
            gbps = run()
            if not name.startswith("loopback"):
                assert all(pool.slot(SlotId(i)).tobytes() == data for i in range(args.count))
            pool.array[:] = 0
            progress(f"pass {rep + 1}: {name} {gbps:.2f} GB/s")
            best[name] = max(best.get(name, 0.0), gbps)
    ours.close()
    store.close()
    pool.close()
    return _rows(best, nbytes)


def _rows(best: dict[str, float], nbytes: int) -> list[dict]:
    """The table: each client's best GB/s and its ratios to the plain reader and to TCP."""
    plain, tcp = best["plain reader"], best["loopback TCP, 1 stream"]
    return [
        {
            "chunk_MB": round(nbytes / 1e6, 2),
            "client": name,
            "GBps": round(gbps, 2),
            "vs_plain": round(gbps / plain, 2),
            "vs_tcp": round(gbps / tcp, 2),
        }
        for name, gbps in best.items()
    ]


def _start_master(tmp: str) -> tuple[subprocess.Popen, int, int]:
    import mooncake

    binary = Path(mooncake.__file__).parent / "mooncake_master"
    master, metadata = free_port(), free_port()
    cmd = [str(binary), f"-rpc_port={master}", "-enable_http_metadata_server=true"]
    cmd += [f"-http_metadata_server_port={metadata}"]
    log = open(os.path.join(tmp, "master.log"), "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", metadata), timeout=1).close()
            return proc, master, metadata
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mooncake_master did not start; see {log.name}") from None
            time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, default=64, help="tokens per chunk (144 KiB each)")
    ap.add_argument("--count", type=int, default=48, help="chunks per pass")
    ap.add_argument("--streams", type=int, default=4, help="connections of MiniFlex's fetch")
    ap.add_argument("--batch", type=int, default=8, help="chunks per batch_get_into")
    ap.add_argument("--repeat", type=int, default=3, help="passes; the best counts")
    ap.add_argument("--json")
    ap.add_argument("--commit", default=None, help="the commit measured (a tree without git)")
    ap.add_argument("--holder", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if min(args.tokens, args.count, args.repeat, args.streams, args.batch) < 1:
        ap.error("--tokens, --count, --streams, --batch and --repeat must be at least 1")
    if args.holder:
        hold(*args.holder, args.tokens * TOKEN_BYTES, args.count)
        return
    try:
        import mooncake.store  # noqa: F401
    except ImportError as exc:
        sys.exit(f"mooncake-wire: Mooncake is not importable ({exc}); see the module docstring")
    with tempfile.TemporaryDirectory(prefix="miniflex-mooncake-wire-") as tmp:
        master, mport, meta = _start_master(tmp)
        redis_server = private_store(tmp, 0, maxmemory="4gb").start()
        holder = subprocess.Popen(
            [
                *(sys.executable, "-m", "bench.mooncake_wire", "--holder", str(mport), str(meta)),
                *("--tokens", str(args.tokens), "--count", str(args.count)),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
            rows = measure(args, mport, meta, redis_server.url)
        finally:
            holder.communicate("", timeout=60)
            redis_server.kill()
            master.kill()
    extra = {**vars(args), "cpus": os.cpu_count(), "provenance": provenance(False, args.commit)}
    extra.pop("holder")
    emit("Mooncake Store's fetch beside Redis's (loopback, one host)", rows, args.json, extra)


if __name__ == "__main__":
    main()
