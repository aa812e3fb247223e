"""A CPU pool that every TP rank of an engine maps: the replicated (MLA) cache's one copy.

MLA's latent cache is the same on every rank, so rank 0 alone writes chunks
(stores, SSD reads) and every rank copies them into its own KV cache. The
ranks are separate processes on one host; they map one file::

    [header 4 KiB][ledger: one int64 per slot][slot 0][slot 1] ...

* The header holds the geometry and how many ranks have attached. Every rank
  creates or opens the file under an exclusive ``flock``; the last one to
  attach unlinks it (unless it is the configured ``cpu_pool_file``), so a
  crash leaves nothing behind in ``/dev/shm``.
* The ledger publishes SSD reads: the scheduler plans one load for all ranks,
  and only rank 0 reads a promoted chunk from SSD into its slot. It then writes
  ``job_id + 1`` (or its negation, if the read failed) into the slot's ledger
  word; the other ranks wait for that word before copying the slot. Job ids
  only grow, so a word left by an earlier job is never mistaken for this one.
  Both sides access the ledger under ``flock`` (a system call on each side,
  so the slot's bytes are visible before the word that announces them).

Nothing else needs a cross-rank signal: a chunk is committed only once every
rank has reported its job, so no rank reads a slot another is still writing.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from miniflex.errors import ConfigError
from miniflex.layout import ALIGN, align_up
from miniflex.pool import HostPool
from miniflex.types import SlotId

__all__ = ["SharedPool", "shared_pool_path"]

_MAGIC = 0x4D46_504F_4F4C_0001  # "MFPOOL", version 1
_HEADER = ALIGN
_POLL_S = 0.0005


def shared_pool_path(engine_id: str, pool_file: str | None) -> Path:
    """Where an engine's shared pool lives: beside ``cpu_pool_file`` if one is configured,
    else in ``/dev/shm`` (the temp directory where there is none). The engine id makes the
    name unique to one start of one engine."""
    if pool_file:
        return Path(f"{pool_file}.{engine_id}")
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return Path(base) / f"miniflex-pool-{engine_id}"


class SharedPool(HostPool):
    """``num_slots x slot_bytes`` of host memory mapped by all ``ranks`` of an engine."""

    def __init__(
        self, num_slots: int, slot_bytes: int, path: Path, ranks: int, keep_file: bool = False
    ) -> None:
        if num_slots < 1:
            raise ConfigError("cpu_bytes", num_slots * slot_bytes, "at least one chunk")
        assert slot_bytes % ALIGN == 0, slot_bytes
        self.num_slots, self.slot_bytes, self.path = num_slots, slot_bytes, path
        self._keep = keep_file
        self._lock_fd = None  # HostPool's per-file lock: not used here
        self._data = align_up(_HEADER + 8 * num_slots)
        size = self._data + num_slots * slot_bytes
        try:
            self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(
                "cpu_pool_file", str(path), f"a writable path for the shared pool ({exc.strerror})"
            ) from exc
        self._mmap: mmap.mmap | None = None
        try:
            with self._locked(fcntl.LOCK_EX):
                found = os.fstat(self._fd).st_size
                if found == 0:
                    self._check_room(size)
                    os.ftruncate(self._fd, size)
                elif found != size:
                    raise self._taken()
                self._mmap = mmap.mmap(self._fd, size, mmap.MAP_SHARED)
                self._attach(np.frombuffer(self._mmap, dtype=np.int64, count=5), ranks)
        except BaseException:
            if self._fd is not None and os.fstat(self._fd).st_size == 0:
                self.path.unlink(missing_ok=True)  # nothing was set up in it
            self.close()
            raise
        self._ledger = np.frombuffer(self._mmap, dtype=np.int64, count=num_slots, offset=_HEADER)
        self.array = np.frombuffer(
            self._mmap, dtype=np.uint8, count=num_slots * slot_bytes, offset=self._data
        ).reshape(num_slots, slot_bytes)

    def _attach(self, header: np.ndarray, ranks: int) -> None:
        if header[0] == 0:
            header[:] = (_MAGIC, self.num_slots, self.slot_bytes, 0, ranks)
        if tuple(header[[0, 1, 2, 4]]) != (_MAGIC, self.num_slots, self.slot_bytes, ranks):
            raise self._taken()
        header[3] += 1
        if header[3] == ranks and not self._keep:
            self.path.unlink(missing_ok=True)  # every rank has it mapped

    def _check_room(self, size: int) -> None:
        """A file system too small for the pool would fail a write into it much later, with
        SIGBUS (a container's /dev/shm is often 64 MiB): refuse it at start-up instead."""
        st = os.statvfs(self.path.parent)
        free = st.f_bavail * st.f_frsize
        if free < size:
            raise ConfigError(
                "cpu_pool_file",
                str(self.path),
                f"room for the {size}-byte pool every rank maps ({free} bytes free there); "
                "give cpu_pool_file a path on a larger memory file system, or lower cpu_bytes",
            )

    def _taken(self) -> ConfigError:
        return ConfigError(
            "cpu_pool_file", str(self.path), "a file that no other engine's pool uses"
        )

    @contextlib.contextmanager
    def _locked(self, how: int) -> Iterator[None]:
        assert self._fd is not None, "the pool is closed"
        fcntl.flock(self._fd, how)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def publish(self, slot: SlotId, job_id: int, ok: bool) -> None:
        """Rank 0: ``slot`` now holds what job ``job_id`` read from SSD (``ok``), or never will."""
        with self._locked(fcntl.LOCK_EX):
            self._ledger[slot] = (job_id + 1) if ok else -(job_id + 1)

    def wait_published(self, slot: SlotId, job_id: int, timeout_s: float) -> bool:
        """Another rank: wait until rank 0 published ``slot`` for job ``job_id``; True if it
        holds the chunk, False if the read failed or nothing came within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._locked(fcntl.LOCK_SH):
                word = int(self._ledger[slot])
            if abs(word) == job_id + 1:
                return word > 0
            if time.monotonic() > deadline:
                return False
            time.sleep(_POLL_S)

    def close(self) -> None:
        if self._fd is None:
            return
        if self._mmap is None:
            os.close(self._fd)
            self._fd = None
            return
        self.array = np.empty((0, self.slot_bytes), dtype=np.uint8)
        self._ledger = np.empty(0, dtype=np.int64)
        with contextlib.suppress(BufferError):
            self._mmap.close()
        self._mmap = None
        if self._keep:
            self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None
