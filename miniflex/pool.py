"""The worker-side CPU pool: ``num_slots`` chunk slots in one page-aligned buffer.

Slots are ``slot_bytes`` apart (a multiple of 4 KiB), so each chunk can be
read or written with O_DIRECT and DMA'd as one contiguous run. The buffer is
anonymous ``mmap`` memory: page-aligned, zero-filled lazily, and returned to
the OS on :meth:`HostPool.close`. With ``path`` it is a shared mapping of that
file instead (e.g. under ``/dev/shm``), so tools can inspect a live pool; the
file is created with mode 0600 and removed on close. Page-locking for CUDA is done by the GPU
movers, which know whether CUDA is present.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
from pathlib import Path

import numpy as np

from miniflex.config import MiniFlexConfig
from miniflex.errors import ConfigError
from miniflex.layout import ALIGN
from miniflex.ranks import TPPlacement
from miniflex.types import SlotId

__all__ = ["MAX_STREAM_SLOTS", "HostPool", "stream_slots"]

MAX_STREAM_SLOTS = 64
"""More staging slots than this would only make the windows of reads longer (32 chunks)."""


def stream_slots(config: MiniFlexConfig, slot_bytes: int, placement: TPPlacement) -> int:
    """Staging slots each pool has past the CPU tier's (``ssd_stream_bytes``, 2 to 64),
    through which loads stream the chunks they read from SSD or fetch from the remote
    store; 0 without an SSD or remote tier, with ``ssd_stream_bytes=0``, or for a pool that
    several ranks share (an MLA model's at TP > 1), whose reads rank 0 publishes slot by slot. The
    scheduler numbers them after the CPU tier's slots, so both halves must agree: both call
    this."""
    tiers = config.ssd_dirs or config.remote_url
    if not tiers or config.ssd_stream_bytes == 0 or placement.shared_pool:
        return 0
    return min(MAX_STREAM_SLOTS, max(2, -(-config.ssd_stream_bytes // slot_bytes)))


class HostPool:
    """``[num_slots x slot_bytes]`` bytes of host memory, 4 KiB-aligned per slot."""

    def __init__(self, num_slots: int, slot_bytes: int, path: str | Path | None = None) -> None:
        if num_slots < 1:
            raise ConfigError(
                "cpu_bytes",
                num_slots * slot_bytes,
                f"must hold at least one {slot_bytes}-byte chunk",
            )
        assert slot_bytes % ALIGN == 0, f"slot_bytes {slot_bytes} is not a multiple of {ALIGN}"
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self.path = Path(path) if path is not None else None
        self._lock_fd: int | None = None
        self._mmap: mmap.mmap | None = self._map(num_slots * slot_bytes)
        self.array = np.frombuffer(self._mmap, dtype=np.uint8).reshape(num_slots, slot_bytes)

    def _map(self, size: int) -> mmap.mmap:
        if self.path is None:
            return mmap.mmap(-1, size)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(
                "cpu_pool_file", str(self.path), f"a writable file path ({exc.strerror})"
            ) from exc
        try:
            # The lock lives as long as the fd: a second engine pointed at the same
            # file is refused instead of overwriting (or truncating) this one's
            # slots; a file left by a crashed engine is unlocked and reused.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                "cpu_pool_file", str(self.path), "a file no other running engine uses"
            ) from None
        self._lock_fd = fd
        os.ftruncate(fd, 0)
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size, mmap.MAP_SHARED)

    @property
    def nbytes(self) -> int:
        return self.num_slots * self.slot_bytes

    @property
    def address(self) -> int:
        """Address of slot 0 (page-aligned), for DMA registration."""
        return int(self.array.ctypes.data)

    def slot(self, slot: SlotId) -> np.ndarray:
        """A writable view of one slot's bytes."""
        return self.array[slot]

    def close(self) -> None:
        """Release the memory. Views obtained earlier must not be used afterwards."""
        if self._mmap is not None:
            self.array = np.empty((0, self.slot_bytes), dtype=np.uint8)
            # A view may still be exported (e.g. a torch tensor); the GC frees it later.
            with contextlib.suppress(BufferError):
                self._mmap.close()
            self._mmap = None
            if self._lock_fd is not None:
                assert self.path is not None
                self.path.unlink(missing_ok=True)
                os.close(self._lock_fd)
                self._lock_fd = None
