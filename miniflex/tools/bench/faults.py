"""Faults the soak injects into a MiniFlex SSD tier: damaged bytes and a full disk.

* :func:`corrupt_chunks` flips one byte in each of some chunks the journal says
  are on disk (so a later load must fail their checksum and recompute them);
* :func:`corrupt_journal` flips a byte inside some journal records and leaves a
  torn record at the end (as a crash in the middle of an append would);
* :class:`SmallDisk` is a loop-mounted ext4 file system of a fixed size for the
  SSD tier, and :meth:`SmallDisk.fill` takes its remaining space, so that the
  store's next journal append meets ENOSPC (data slots are preallocated). It
  needs root and ``mount``; where that is refused, ``SmallDisk.reason`` says
  why and the ENOSPC fault is skipped and reported as such.

Run the two corruptions while no server uses the directory (after a ``kill -9``).
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

from miniflex.ssd.journal import RECORD_BYTES, journal_geometry, read_journal
from miniflex.ssd.store import DATA_FILE, JOURNAL_FILE

__all__ = ["SmallDisk", "corrupt_chunks", "corrupt_journal"]


def corrupt_chunks(rank_dir: str | Path, count: int, seed: int) -> list[int]:
    """Flip one byte in each of ``count`` random chunks the journal of ``rank_dir`` holds.

    One data file per store (a single SSD directory). Returns the slots hit.
    """
    journal = os.path.join(rank_dir, JOURNAL_FILE)
    geometry = journal_geometry(journal)
    if geometry is None:
        return []
    digest, slot_bytes, num_slots = geometry
    live = sorted(s for s, _ in read_journal(journal, digest, slot_bytes, num_slots).values())
    rng = random.Random(seed)
    hit = sorted(rng.sample(live, min(count, len(live))))
    with open(os.path.join(rank_dir, DATA_FILE), "r+b") as f:
        for slot in hit:
            at = slot * slot_bytes + rng.randrange(slot_bytes)
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())
    return hit


def corrupt_journal(rank_dir: str | Path, records: int, seed: int) -> int:
    """Flip a byte inside ``records`` random records (never the header) and append half a
    record of garbage. Returns how many records were damaged."""
    path = os.path.join(rank_dir, JOURNAL_FILE)
    rng = random.Random(seed)
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        whole = size // RECORD_BYTES - 1  # records after the header
        picked = rng.sample(range(1, whole + 1), min(records, whole))
        for rec in picked:
            at = rec * RECORD_BYTES + rng.randrange(RECORD_BYTES - 4)  # not the unused pad
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0xFF]))
        f.seek(0, os.SEEK_END)
        f.write(rng.randbytes(RECORD_BYTES // 2))
        f.flush()
        os.fsync(f.fileno())
    return len(picked)


class SmallDisk:
    """A loop-mounted ext4 of ``mib`` MiB (root only); :attr:`path` is None where not allowed."""

    def __init__(self, mib: int) -> None:
        self.mib = mib
        self.path: Path | None = None
        self.reason: str | None = "not set up"
        self._work: Path | None = None
        self._filler: Path | None = None

    def __enter__(self) -> SmallDisk:
        self.reason = None
        self._work = Path(tempfile.mkdtemp(prefix="miniflex-soak-disk-", dir="/var/tmp"))
        if os.geteuid() != 0 or not shutil.which("mount") or not shutil.which("mkfs.ext4"):
            self.reason = "a loop-mounted file system needs root, mount and mkfs.ext4"
            return self
        image, mnt = self._work / "disk.img", self._work / "mnt"
        mnt.mkdir()
        with open(image, "wb") as f:
            f.truncate(self.mib << 20)
        mkfs = ["mkfs.ext4", "-q", "-F", "-m", "0", str(image)]  # no blocks reserved for root
        for cmd in (mkfs, ["mount", "-o", "loop", str(image), str(mnt)]):
            done = subprocess.run(cmd, capture_output=True, check=False)
            if done.returncode:
                self.reason = f"{cmd[0]} failed: {done.stderr.decode().strip()}"
                return self
        self.path = mnt
        return self

    def fill(self) -> int:
        """Take every free byte (a filler file) until ENOSPC; returns the bytes taken."""
        assert self.path is not None
        self._filler = self.path / "filler"
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:  # whole MiBs, then the last blocks
            return _write_until_full(fd, 1 << 20) + _write_until_full(fd, 4096)
        finally:
            os.close(fd)

    def release(self) -> None:
        """Give the space the filler took back."""
        if self._filler is not None:
            self._filler.unlink(missing_ok=True)
            self._filler = None

    def __exit__(self, *exc: object) -> None:
        self.release()
        if self.path is not None:  # lazily only if something still holds it open
            done = subprocess.run(["umount", str(self.path)], capture_output=True, check=False)
            if done.returncode:
                subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)
            self.path = None
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)


def _write_until_full(fd: int, size: int) -> int:
    block, taken = bytes(size), 0
    try:
        while True:
            taken += os.write(fd, block)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    return taken
