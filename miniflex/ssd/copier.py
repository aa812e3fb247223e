"""The worker side of the SSD tier: chunk copies between the CPU pool and the SSD store.

One per worker process (TP rank), owned by the connector's handler: write-backs
run on its ssd-write lane, promotions on its ssd-read lane (the store serializes
them). It executes what the scheduler's
:class:`~miniflex.tiers.TierStack` decided and reports which chunks failed;
it never raises for I/O failures (a failed chunk is recomputed or not kept).

Example::

    copier = SSDCopier(config, pool, namespace_digest, rank=0)
    failed = copier.promote([SlotCopy(key, cpu=SlotId(3), ssd=SlotId(17))])
    failed = copier.demote([SlotCopy(key2, cpu=SlotId(4), ssd=SlotId(18))])
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence

from miniflex.config import MiniFlexConfig
from miniflex.plan import SlotCopy
from miniflex.pool import HostPool
from miniflex.ssd.backends import make_backend
from miniflex.ssd.preflight import check_ssd_tier
from miniflex.ssd.read_probe import PROBE_BYTES, probe_read_bandwidth
from miniflex.ssd.store import SSDStore, make_dirs, rank_dirs
from miniflex.types import ChunkKey

__all__ = ["SSDCopier"]

log = logging.getLogger("miniflex.ssd")


class SSDCopier:
    """Opens (and recovers) this rank's SSD store; moves whole pool slots to and from it.

    Construction first checks the settings against the machine
    (:func:`~miniflex.ssd.preflight.check_ssd_tier`), so unusable directories,
    too little free space, a file system without O_DIRECT or a directory another
    live store uses stop the engine at start-up with one ConfigError, before
    anything is created; what a failed construction created is removed.
    """

    def __init__(
        self,
        config: MiniFlexConfig,
        pool: HostPool,
        namespace_digest: bytes,
        rank: int = 0,
        total_bytes: int | None = None,
    ) -> None:
        """``total_bytes``: this store's size (default ``ssd_bytes``; with TP, its share)."""
        self._pool = pool
        total_bytes = config.ssd_bytes if total_bytes is None else total_bytes
        check_ssd_tier(config.ssd_dirs, total_bytes, pool.slot_bytes, ranks=(rank,))
        self._io = make_backend(config.ssd_io)
        made: list[str] = []
        try:
            dirs = self._dirs = rank_dirs(config.ssd_dirs, rank)
            made = make_dirs(dirs, "ssd_dirs")
            self.store = SSDStore(
                dirs,
                total_bytes,
                pool.slot_bytes,
                namespace_digest,
                backend=self._io,
            )
        except BaseException:
            self._io.close()
            for d in reversed(made):  # a refused start leaves nothing behind it created
                with contextlib.suppress(OSError):
                    os.rmdir(d)
            raise
        self.backend = self._io.name
        log.info(
            "SSD tier of rank %d: %d slots in %s, %s I/O, %d chunks recovered",
            rank,
            self.store.num_slots,
            ", ".join(dirs),
            self.backend,
            len(self.store.recovered()),
        )

    def promote(
        self,
        copies: Sequence[SlotCopy],
        part_bytes: int = 0,
        on_part: Callable[[int], None] | None = None,
    ) -> tuple[set[ChunkKey], float]:
        """Read each chunk from SSD into its CPU slot: (keys that failed and were dropped,
        seconds the read took, not counting a wait for a write-back holding the store).
        ``part_bytes``, ``on_part``: read in parts, told of each (:meth:`SSDStore.read`)."""
        items = [(c.key, c.ssd, self._view(c)) for c in copies]
        ok, seconds = self.store.read(items, part_bytes, on_part)
        failed = {c.key for c, good in zip(copies, ok, strict=True) if not good}
        return failed, seconds

    def demote(self, copies: Sequence[SlotCopy]) -> set[ChunkKey]:
        """Write each CPU slot to its SSD slot, durably; returns the keys that failed."""
        ok = self.store.write([(c.key, c.ssd, self._view(c)) for c in copies])
        return {c.key for c, good in zip(copies, ok, strict=True) if not good}

    def probe_read(self) -> float | None:
        """Bytes/s this disk reads chunks back at, measured now in a scratch file beside the
        store (:mod:`miniflex.ssd.read_probe`; at most a quarter of the tier's size, so that
        it fits where the tier does); None if the probe could not run."""
        size = self.store.num_slots * self._pool.slot_bytes  # at most a quarter of the tier
        return probe_read_bandwidth(
            self._io, self._dirs[0], self._pool.slot_bytes, min(PROBE_BYTES, size // 4)
        )

    def clear(self) -> None:
        self.store.clear()

    def close(self) -> None:
        self.store.close()
        self._io.close()

    def _view(self, c: SlotCopy) -> memoryview:
        return memoryview(self._pool.slot(c.cpu))
