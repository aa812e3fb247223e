"""SSD slot I/O bandwidth of both MiniFlex backends against fio on the same file system.

    python -m bench.ssd_bench [--dir DIR] [--mib 1024] [--json PATH]

For each chunk size (0.5 .. 64 MiB) and backend (io_uring, threads), writes a
fresh preallocated ``--mib`` MiB file with O_DIRECT in chunk-sized ops, reads
it back, checks the bytes, and prints GB/s. The ceiling is ``fio`` with the
same block size, queue depth, size and ``--direct=1`` in the same run (the
io_uring engine, or libaio where that fails); each MiniFlex figure is also
shown as a ratio to fio's. Best of ``--repeat`` passes. Without fio installed
the fio columns are left empty. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

from miniflex.pool import HostPool
from miniflex.ssd import IOOp, make_backend, open_direct
from miniflex.tools.bench.report import emit

MIB = 1 << 20
CHUNKS_MIB = (0.5, 1, 4, 16, 64)
BACKENDS = ("io_uring", "threads")


def queue_depth(chunk: int) -> int:
    """16..64 ops in flight, about 256 MiB of them."""
    return max(16, min(64, 256 * MIB // chunk))


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def best_gbps(nbytes: int, repeat: int, once: Callable[[], float]) -> float:
    """GB/s of the fastest of ``repeat`` calls of ``once``, which returns seconds."""
    return round(max(nbytes / once() / 1e9 for _ in range(repeat)), 2)


def miniflex_pass(
    backend: str, path: str, chunk: int, src: np.ndarray, dst: np.ndarray, write: bool
) -> float:
    """Seconds for one full write (fresh file) or read of ``path`` in ``chunk``-sized ops."""
    total = src.nbytes
    if write and os.path.exists(path):
        os.unlink(path)
    fd = open_direct(path, total)
    buf = src if write else dst
    try:
        with make_backend(backend, queue_depth(chunk)) as io:
            ops = [
                IOOp(fd, path, off, memoryview(buf[off : off + chunk]), write)
                for off in range(0, total, chunk)
            ]
            t0 = time.perf_counter()
            io.run(ops)
            return time.perf_counter() - t0
    finally:
        os.close(fd)


def fio_gbps(path: str, chunk: int, mib: int, rw: str, engine: str) -> float:
    """fio's bandwidth in GB/s for one sequential ``rw`` pass over ``path``."""
    cmd = [
        "fio",
        "--name=ceiling",
        f"--filename={path}",
        f"--size={mib}M",
        "--direct=1",
        f"--ioengine={engine}",
        f"--bs={chunk}",
        f"--iodepth={queue_depth(chunk)}",
        f"--rw={rw}",
        "--output-format=json",
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0]
    return job[rw]["bw_bytes"] / 1e9


def fio_engine(path: str) -> str | None:
    """``io_uring`` if fio can use it here, else ``libaio``, else None (no fio)."""
    if shutil.which("fio") is None:
        return None
    for engine in ("io_uring", "libaio"):
        try:
            fio_gbps(path, MIB, 4, "write", engine)
            return engine
        except (subprocess.CalledProcessError, ValueError, KeyError):
            continue
    return None


def measure_fio(path: str, chunk: int, mib: int, engine: str, repeat: int) -> dict[str, float]:
    """Best-of-``repeat`` fio write (each into a fresh file, like MiniFlex) and read GB/s."""
    writes = []
    for _ in range(repeat):
        if os.path.exists(path):
            os.unlink(path)
        writes.append(fio_gbps(path, chunk, mib, "write", engine))
    reads = [fio_gbps(path, chunk, mib, "read", engine) for _ in range(repeat)]
    os.unlink(path)
    return {"write": round(max(writes), 2), "read": round(max(reads), 2)}


def measure(
    backend: str, path: str, chunk: int, src: np.ndarray, dst: np.ndarray, repeat: int
) -> dict[str, object]:
    nbytes = src.nbytes
    w = best_gbps(nbytes, repeat, lambda: miniflex_pass(backend, path, chunk, src, dst, True))
    dst[:] = 0
    r = best_gbps(nbytes, repeat, lambda: miniflex_pass(backend, path, chunk, src, dst, False))
    ok = bool(np.array_equal(src, dst))
    os.unlink(path)
    return {"write_GBps": w, "read_GBps": r, "verified": ok}


def disk_parser(doc: str, repeat: int) -> argparse.ArgumentParser:
    """The arguments every disk bench takes: ``--dir``, ``--repeat``, ``--json``."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dir", default="/var/tmp", help="a directory on the SSD to test")
    ap.add_argument("--repeat", type=int, default=repeat, help="passes per figure; the best counts")
    ap.add_argument("--json")
    return ap


def main() -> None:
    ap = disk_parser(__doc__, repeat=2)
    ap.add_argument("--mib", type=int, default=1024, help="file size per pass (MiB)")
    args = ap.parse_args()
    total = args.mib * MIB
    assert total % (64 * MIB) == 0, "--mib must be a multiple of 64"
    path = os.path.join(args.dir, f"miniflex-ssd-bench-{os.getpid()}.dat")
    src_pool, dst_pool = HostPool(1, total), HostPool(1, total)
    src, dst = src_pool.slot(0), dst_pool.slot(0)
    src.view(np.uint64)[:] = np.random.default_rng(0).integers(0, 2**63, total // 8, np.uint64)
    engine = fio_engine(path)
    progress(f"fio engine: {engine or 'none (fio not installed or failing)'}")
    rows: list[dict] = []
    try:
        for chunk_mib in CHUNKS_MIB:
            chunk = int(chunk_mib * MIB)
            fio = measure_fio(path, chunk, args.mib, engine, args.repeat) if engine else {}
            progress(f"{chunk_mib} MiB, qd {queue_depth(chunk)}: fio {fio}")
            for backend in BACKENDS:
                got = measure(backend, path, chunk, src, dst, args.repeat)
                progress(f"{chunk_mib} MiB, qd {queue_depth(chunk)}: {backend} {got}")
                row: dict[str, object] = {
                    "chunk_MiB": chunk_mib,
                    "qd": queue_depth(chunk),
                    "backend": backend,
                    "write_GBps": got["write_GBps"],
                    "read_GBps": got["read_GBps"],
                    "fio_write_GBps": fio.get("write", ""),
                    "fio_read_GBps": fio.get("read", ""),
                }
                if fio:
                    row["write_vs_fio"] = round(float(got["write_GBps"]) / fio["write"], 2)
                    row["read_vs_fio"] = round(float(got["read_GBps"]) / fio["read"], 2)
                row["verified"] = got["verified"]
                rows.append(row)
    finally:
        if os.path.exists(path):
            os.unlink(path)
        src_pool.close()
        dst_pool.close()
    fs = subprocess.run(["df", "-T", args.dir], capture_output=True, text=True).stdout
    extra = {"dir": args.dir, "mib": args.mib, "repeat": args.repeat, "fio_engine": engine}
    extra["fs"] = fs.splitlines()[-1].split()[1] if fs else ""
    emit(f"SSD slot I/O, {args.mib} MiB per pass, O_DIRECT", rows, args.json, extra)


if __name__ == "__main__":
    main()
