"""SSD admission: write chunks the CPU tier evicts to SSD only while that can pay off.

A chunk on SSD saves work only if reading it back is faster than recomputing
it. On a disk slower than that (the benchmark GPU machine's, for an 8B model:
docs/benchmarks.md, "CPU+SSD against the CPU tier, byte for byte"), every
write-back is pure cost: disk bandwidth, CPU slots held while written, work on
MiniFlex's threads, and chunks the cost model then declines to load anyway.
So the SSD tier admits chunks only while a read clearly beats recomputing even
the most expensive chunk the engine can compute (the last one of its longest
prompt, where attention costs most): admission turns on when a read takes at
most half of that recompute and off when it takes more than 0.8 of it. While it
is off the hierarchy behaves as if there were no SSD tier: no write-back, no
CPU slots set aside for it. The margin is there because write-back is paid in
CPU capacity (``max_writeback`` slots kept free or being written): an SSD hit
that saves little does not pay for the CPU hits lost to it.

The ratio is a moving average over ``SMOOTH_S`` seconds. The recompute figure
comes from the prefill model, which is refitted every few steps and moves
widely between refits under a mixed load; compared raw, admission flipped on
and off over and over on a disk near the line, and each flip set CPU slots
aside for write-back again, so fewer tokens were served from cache than with
no SSD tier at all.

The disk's speed is the cost model's SSD read bandwidth once it is measured:
by the workers' start-up read probe (:mod:`miniflex.ssd.read_probe`), given as
``ssd_read_gbps``, or seen in real reads. Its default guess is never used here.
The first decision is made on fitted figures. Before the prefill model is fitted
(the engine's costs say None until then), a rough figure can only hold writes
back: the mean seconds per token of the prefill steps seen, which counts each
step's fixed cost as its tokens' and so prices recompute high, makes a slow disk
look fast (it can put a chunk's read well below the fitted ratio: docs/benchmarks.md,
"burst"). If a read takes more than ``OFF_RATIO`` of even that figure, nothing is
written before the fit; otherwise, and before the disk is measured, everything is
admitted. Long prompts reach the fit late (it needs
eight prefill steps, and a long conversation can give fewer), and without the
rough figure write-back went on until then however slow the disk. While
admission is off, one chunk is still written every ``PROBE_EVERY_S``. Each
switch is logged with the ratio.

Example::

    admission = SSDAdmission(read_seconds=lambda: 0.007, recompute_seconds=lambda: 0.003)
    admission.admits()   # False, except one probe write every PROBE_EVERY_S
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

__all__ = ["OFF_RATIO", "ON_RATIO", "PROBE_EVERY_S", "SMOOTH_S", "SSDAdmission"]

logger = logging.getLogger(__name__)

PROBE_EVERY_S = 10.0
"""While the SSD tier admits nothing, one chunk is written this often (to keep measuring)."""
ON_RATIO = 0.5
"""Admission turns on when reading a chunk takes at most this share of recomputing it."""
OFF_RATIO = 0.8
"""Admission turns off when reading a chunk takes more than this share of recomputing it."""
SMOOTH_S = 20.0
"""Time constant (seconds) of the moving average of the read/recompute ratio."""


class SSDAdmission:
    """Decides whether an evicted CPU chunk goes to SSD; scheduler side, one thread."""

    def __init__(
        self,
        read_seconds: Callable[[], float | None],
        recompute_seconds: Callable[[], float | None],
        clock: Callable[[], float] = time.monotonic,
        rough_recompute_seconds: Callable[[], float | None] | None = None,
    ) -> None:
        """``read_seconds()``: predicted seconds to load one chunk from SSD (None: unknown);
        ``recompute_seconds()``: seconds to recompute the costliest chunk (None: unknown);
        ``rough_recompute_seconds()``: before that is known, a figure that prices it high
        (None: none either), which can only hold writes back."""
        self._read_seconds = read_seconds
        self._recompute_seconds = recompute_seconds
        self._rough_seconds = rough_recompute_seconds or (lambda: None)
        self._rough_off = False  # the rough figure holds writes back (logged when it starts)
        self._clock = clock
        self._last_probe: float | None = None
        self.declined = 0
        """Evicted chunks not written because the disk was slower than recompute."""
        self.switches = 0
        """Times admission turned on or off once both speeds were known (each one logged)."""
        self._ratio: float | None = None  # moving average of read / recompute
        self._last: float = 0.0  # the ratio seen at the last update, held since then
        self._ratio_at = 0.0  # clock of the last update
        self._on: bool | None = None  # None: not decided yet (a speed unknown)

    @property
    def pays_off(self) -> bool:
        """Whether SSD hits are predicted to pay for the write-back: until both speeds are
        known, True unless a read takes more than :data:`OFF_RATIO` of even the rough
        recompute figure; then on while a chunk's read takes at most :data:`ON_RATIO` of its
        recompute, off past :data:`OFF_RATIO`, unchanged in between. The ratio is averaged
        over :data:`SMOOTH_S`, because the recompute figure moves with every refit of the
        prefill model."""
        ratio = self._update_ratio()
        if ratio is None:
            return not self._rough_holds_back()
        if self._on is None:
            self._switch(ratio <= ON_RATIO, ratio, first=True)
        elif self._on and ratio > OFF_RATIO:
            self._switch(False, ratio)
        elif not self._on and ratio <= ON_RATIO:
            self._switch(True, ratio)
        assert self._on is not None
        return self._on

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

    def _rough_holds_back(self) -> bool:
        """Before a decision: whether a read takes more than :data:`OFF_RATIO` of even the
        rough recompute figure (nothing is decided on it; the fitted figures decide)."""
        read, rough = self._read_seconds(), self._rough_seconds()
        ratio = read / rough if read is not None and rough is not None and rough > 0 else 0.0
        off = ratio > OFF_RATIO
        if off and not self._rough_off:
            logger.info(
                "SSD admission off until the prefill model is fitted: a chunk reads in %.2f "
                "of its recompute by the rough figure, which prices recompute high",
                ratio,
            )
        self._rough_off = off
        return off

    def _update_ratio(self) -> float | None:
        """The averaged read/recompute ratio (None: a speed not known yet). Each ratio seen
        weighs by how long it held, until the next one was seen; the one seen now counts
        from now on (a figure seen after an idle spell does not stand for the spell)."""
        read, recompute = self._read_seconds(), self._recompute_seconds()
        if read is None or recompute is None or recompute <= 0:
            return self._ratio  # not known yet (or no longer: the last average stands)
        sample, now = read / recompute, self._clock()
        if self._ratio is None:
            self._ratio = sample
        else:
            weight = 1.0 - math.exp(-max(0.0, now - self._ratio_at) / SMOOTH_S)
            self._ratio += weight * (self._last - self._ratio)
        self._last, self._ratio_at = sample, now
        return self._ratio

    def _switch(self, on: bool, ratio: float, first: bool = False) -> None:
        self.switches += 0 if first else 1
        self._on = on
        logger.info(
            "SSD admission %s: a chunk reads in %.2f of its recompute (averaged; on at %.2f, "
            "off past %.2f)",
            "on" if on else "off",
            ratio,
            ON_RATIO,
            OFF_RATIO,
        )
