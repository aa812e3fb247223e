"""Checksums of slots read in parts, computed beside the read of the next part.

A slot's CRC32 covers the whole slot, but CRC32 runs over bytes in order, so it can be
added up part by part (``zlib.crc32(part, crc_so_far)``). :class:`PartChecksums` does
that on a thread of its own while the store reads the next part (``zlib`` releases the
interpreter lock on large buffers, the I/O backend while it waits): a read in parts is
then checked at the pace of the slower of the two, not of both in turn. Example::

    sums = PartChecksums([buf_a, buf_b], threaded=True)
    for lo, hi in parts:
        read_part(lo, hi)
        sums.add(lo, hi)
    crc_a, crc_b = sums.result()
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["PartChecksums"]


class PartChecksums:
    """Running CRC32s of ``bufs`` over the parts added so far, in order."""

    def __init__(self, bufs: Sequence[memoryview], threaded: bool) -> None:
        """``threaded``: add each part on a thread of its own (False: at :meth:`add`)."""
        self._bufs = [memoryview(b).cast("B") for b in bufs]
        self._crcs = [0] * len(self._bufs)
        self._pool = ThreadPoolExecutor(1, "miniflex-crc") if threaded and self._bufs else None
        self._pending: Future[None] | None = None

    def add(self, lo: int, hi: int) -> None:
        """Bytes ``[lo, hi)`` of every buffer are in (parts come in order, back to back)."""
        if self._pool is None:
            self._part(lo, hi)
            return
        self._wait()
        self._pending = self._pool.submit(self._part, lo, hi)

    def result(self) -> list[int]:
        """Each buffer's CRC32 over every part added."""
        self._wait()
        if self._pool is not None:
            self._pool.shutdown()
        return self._crcs

    def _wait(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def _part(self, lo: int, hi: int) -> None:
        for i, buf in enumerate(self._bufs):
            self._crcs[i] = zlib.crc32(buf[lo:hi], self._crcs[i])
