"""Subprocess for ``test_crash.py``: write chunks forever, report each one acknowledged.

``python -m tests.ssd.crash_writer ROOT BACKEND FIRST_KEY LOG`` opens the store
the test uses and writes batches of 1-6 chunks to random slots (so slots are
overwritten all the time). Before a batch it appends ``T key slot`` per chunk
to LOG, and ``A key`` per chunk only once ``write`` returned True for it. The
test kills it with SIGKILL at some moment and checks what a reopen finds.
"""

from __future__ import annotations

import mmap
import os
import sys
from pathlib import Path

import numpy as np

from miniflex.ssd import BACKENDS, SSDStore
from miniflex.types import ChunkKey, SlotId

SLOT = 64 << 10
NUM_SLOTS = 32
DIGEST = b"crash-test-ns-16"


def chunk(key: int) -> np.ndarray:
    """Chunk ``key``'s bytes (seeded by the key) in page-aligned memory."""
    out = np.frombuffer(mmap.mmap(-1, SLOT), dtype=np.uint8)
    out.view(np.uint64)[:] = np.random.default_rng(key).integers(0, 2**63, SLOT // 8, np.uint64)
    return out


def open_store(root: Path, backend: str) -> SSDStore:
    dirs = [root / "a", root / "b"]
    for d in dirs:
        d.mkdir(exist_ok=True)
    return SSDStore([str(d) for d in dirs], NUM_SLOTS * SLOT, SLOT, DIGEST, BACKENDS[backend](8))


def main(root: str, backend: str, first_key: str, log_path: str) -> None:
    store = open_store(Path(root), backend)
    rng = np.random.default_rng(int(first_key))
    key = int(first_key)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    while True:
        slots = rng.permutation(NUM_SLOTS)[: int(rng.integers(1, 7))]
        batch = [(key + i, int(s)) for i, s in enumerate(slots)]
        key += len(batch)
        bufs = [chunk(k) for k, _ in batch]
        os.write(log, "".join(f"T {k} {s}\n" for k, s in batch).encode())
        ok = store.write(
            [(ChunkKey(k), SlotId(s), memoryview(b)) for (k, s), b in zip(batch, bufs, strict=True)]
        )
        acked = [k for (k, _), good in zip(batch, ok, strict=True) if good]
        os.write(log, "".join(f"A {k}\n" for k in acked).encode())


if __name__ == "__main__":
    main(*sys.argv[1:5])
