"""SSD admission: write chunks the CPU tier evicts to SSD only while that can pay off.

A chunk on SSD saves work only if reading it back is faster than recomputing
it. On a disk slower than that (the H200 machine's, for an 8B model: a 64-token
chunk of 9.4 MB reads in about 7 ms and recomputes in about 2-3 ms), every
write-back is pure cost: disk bandwidth, CPU slots held while written, work on
MiniFlex's threads, and chunks the cost model then declines to load anyway.
So the SSD tier admits nothing while the disk is known to be slower than
recomputing even the most expensive chunk the engine can compute (the last one
of its longest prompt, where attention costs most). Then the hierarchy behaves
as if there were no SSD tier: no write-back, no CPU slots set aside for it.

The disk's speed is the cost model's SSD read bandwidth once it is measured:
by the workers' start-up read probe (:mod:`miniflex.ssd.read_probe`), given as
``ssd_read_gbps``, or seen in real reads. Its default guess is never used here,
and before a measurement, or before the cost model has seen a prefill step,
everything is admitted. While admission is off, one chunk is still written
every ``PROBE_EVERY_S``.

Example::

    admission = SSDAdmission(read_seconds=lambda: 0.007, recompute_seconds=lambda: 0.003)
    admission.admits()   # False, except one probe write every PROBE_EVERY_S
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["PROBE_EVERY_S", "SSDAdmission"]

PROBE_EVERY_S = 10.0
"""While the SSD tier admits nothing, one chunk is written this often (to keep measuring)."""


class SSDAdmission:
    """Decides whether an evicted CPU chunk goes to SSD; scheduler side, one thread."""

    def __init__(
        self,
        read_seconds: Callable[[], float | None],
        recompute_seconds: Callable[[], float | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``read_seconds()``: predicted seconds to load one chunk from SSD (None: unknown);
        ``recompute_seconds()``: seconds to recompute the costliest chunk (None: unknown)."""
        self._read_seconds = read_seconds
        self._recompute_seconds = recompute_seconds
        self._clock = clock
        self._last_probe: float | None = None
        self.declined = 0
        """Evicted chunks not written because the disk was slower than recompute."""

    @property
    def pays_off(self) -> bool:
        """Whether a chunk read from SSD is predicted to beat recomputing it (True while
        either side is unknown)."""
        read, recompute = self._read_seconds(), self._recompute_seconds()
        return read is None or recompute is None or read <= recompute

    def admits(self) -> bool:
        """Whether the chunk being evicted now is written to SSD. False is counted in
        :attr:`declined`; a probe write every :data:`PROBE_EVERY_S` is admitted regardless."""
        if self.pays_off:
            return True
        now = self._clock()
        if self._last_probe is None or now - self._last_probe >= PROBE_EVERY_S:
            self._last_probe = now
            return True
        self.declined += 1
        return False
