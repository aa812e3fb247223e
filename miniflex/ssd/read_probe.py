"""The start-up read probe: how fast this disk reads chunks back, measured, not assumed.

Whether an SSD tier is worth writing to depends on how fast it reads a chunk
back compared with recomputing it (:mod:`miniflex.tiers.admission`). Nothing is
known about a new disk, and a tier that admits nothing would never learn it
from real reads. So each worker with an SSD tier writes ``PROBE_BYTES`` of
chunk-sized blocks into a scratch file beside its store (O_DIRECT, synced),
reads them back as one batch through the store's I/O backend, at its queue
depth, and removes the file. Reads of the data file itself would not do: its
free slots were never written, and a file system answers reads of unwritten
extents without touching the disk.

Example::

    bps = probe_read_bandwidth(backend, "/nvme/miniflex/rank0", slot_bytes=9 << 20)
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import time

from miniflex.ssd.base import IOBackend, IOOp
from miniflex.ssd.files import open_direct

__all__ = ["PROBE_BYTES", "SCRATCH", "probe_read_bandwidth"]

log = logging.getLogger("miniflex.ssd")

PROBE_BYTES = 256 << 20
"""Bytes written and read back (at most; at least 4 chunks): past a disk's own cache."""
SCRATCH = ".read_probe"


def probe_read_bandwidth(
    backend: IOBackend, directory: str, slot_bytes: int, probe_bytes: int = PROBE_BYTES
) -> float | None:
    """Bytes per second of reading chunk-sized blocks back with O_DIRECT (None: the probe
    could not run, logged; the cost model then keeps its estimate)."""
    n = max(4, probe_bytes // slot_bytes)
    path = os.path.join(directory, SCRATCH)
    buf = mmap.mmap(-1, n * slot_bytes)  # page-aligned, as O_DIRECT needs
    try:
        seconds = _write_then_read(backend, path, buf, n, slot_bytes)
    except OSError as exc:  # a probe must never keep vLLM from starting
        log.warning(
            "SSD read probe in %s failed (%s); the cost model keeps its estimate", path, exc
        )
        return None
    finally:
        buf.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    bps = n * slot_bytes / seconds
    log.info("SSD read probe: %d chunks of %d bytes, %.2f GB/s", n, slot_bytes, bps / 1e9)
    return bps


def _write_then_read(backend: IOBackend, path: str, buf: mmap.mmap, n: int, slot: int) -> float:
    """Seconds to read back ``n`` blocks written (and synced) just before, in one batch."""
    block = os.urandom(1 << 20)  # never zeros: some devices shortcut them
    for start in range(0, len(buf), len(block)):
        buf[start : start + len(block)] = block[: len(buf) - start]
    fd = open_direct(path, n * slot)
    try:
        with memoryview(buf) as view:
            ops = [
                IOOp(fd, path, i * slot, view[i * slot : (i + 1) * slot], True) for i in range(n)
            ]
            backend.run(ops)
            os.fdatasync(fd)
            ops = [IOOp(fd, path, op.offset, op.buf, False) for op in ops]
            t0 = time.perf_counter()
            backend.run(ops)
            seconds = time.perf_counter() - t0
            for op in ops:
                op.buf.release()
            del ops
    finally:
        os.close(fd)
    return max(seconds, 1e-9)
