"""The SSD tier's settings checked against the machine before anything is created.

``miniflex serve`` runs :func:`check_ssd_tier` before vLLM starts, and each
worker's connector runs it first thing, before its store opens. Every refusal
is one :class:`~miniflex.errors.ConfigError` naming the setting, the value and
the fix, for example::

    MiniFlex config ssd_dirs='/mnt/ro': it is on a read-only file system; remount
    it read-write or give a directory on a writable disk

Checked, per directory: it takes a new file (not read-only, writable by this
user, not full); its file system accepts ``O_DIRECT``; no live store holds the
data file there (another server on the same directory); and the file system
has room for every rank's data file and journal (what an existing data file
already holds counts as room). Probe files are removed again, so a refused
start leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from miniflex.errors import ConfigError
from miniflex.layout import ALIGN
from miniflex.ssd.journal import RECORD_BYTES
from miniflex.ssd.read_probe import PROBE_BYTES
from miniflex.ssd.store import DATA_FILE, rank_dirs, slot_count
from miniflex.units import format_bytes

__all__ = ["LOCK_WAIT_S", "SSDCheck", "check_ssd_tier", "lock_holder"]

LOCK_WAIT_S = 10.0
"""How long a store lock held by another process may take to be released before the
directory counts as in use (a server shutting down lets go when its workers exit)."""


@dataclass(frozen=True)
class SSDCheck:
    """What :func:`check_ssd_tier` found: the size of each data file and the free space."""

    file_bytes: int
    """Bytes of each data file (one per directory and rank)."""
    free_bytes: dict[str, int]
    """Free space of each directory's file system, before the tier is allocated."""

    def describe(self) -> str:
        free = ", ".join(f"{d} ({format_bytes(n)} free)" for d, n in self.free_bytes.items())
        return f"SSD tier: a {format_bytes(self.file_bytes)} file in each of {free}; O_DIRECT ok"


def check_ssd_tier(
    dirs: Sequence[str],
    ssd_bytes: int,
    slot_bytes: int | None,
    ranks: Sequence[int] = (0,),
    lock_wait_s: float = LOCK_WAIT_S,
) -> SSDCheck:
    """Refuse (ConfigError) settings the SSD tier cannot run with; creates nothing.

    ``slot_bytes``: one chunk of this model, or None where it is not known yet
    (then the files are assumed to be ``ssd_bytes`` split over ``dirs``).
    ``ranks``: the TP ranks whose stores will live under these directories.
    Run it before this process opens a store there: its own lock would count.
    ``lock_wait_s``: how long another process's lock may take to go away.
    """
    file_bytes = _file_bytes(dirs, ssd_bytes, slot_bytes)
    for d in dirs:
        _check_writable(d, d)
        for rd in (rank_dirs([d], r)[0] for r in ranks):
            if os.path.isdir(rd):  # made by an earlier start: the store writes in there
                _check_writable(rd, d)
    for r in ranks:
        for d, rd in zip(dirs, rank_dirs(dirs, r), strict=True):
            pid = lock_holder(os.path.join(rd, DATA_FILE), lock_wait_s)
            if pid is not None:
                raise ConfigError(
                    "ssd_dirs",
                    d,
                    f"a live MiniFlex store ({_who(pid)}) uses it; give each server "
                    "a directory of its own, or stop that server first",
                )
    free = _check_space(dirs, ssd_bytes, file_bytes, slot_bytes, ranks)
    return SSDCheck(file_bytes, free)


def lock_holder(path: str, wait_s: float = LOCK_WAIT_S) -> int | None:
    """The pid that holds ``path``'s store lock (0 if it cannot be told), None if unlocked.

    A holder gets ``wait_s`` seconds to let go: a server that is shutting down
    (an engine closed just before a new one starts) releases it when its
    workers exit.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # no data file yet: nobody holds it
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return None
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return _flock_owner(os.fstat(fd).st_ino) or 0
                time.sleep(0.1)
    finally:
        os.close(fd)  # also drops the shared lock just taken


def _file_bytes(dirs: Sequence[str], ssd_bytes: int, slot_bytes: int | None) -> int:
    n = len(dirs)
    if slot_bytes is None:
        return ssd_bytes // n // ALIGN * ALIGN
    if ssd_bytes < n * slot_bytes:
        raise ConfigError(
            "ssd_bytes",
            format_bytes(ssd_bytes),
            f"holds no chunk per directory: a chunk of this model is {format_bytes(slot_bytes)} "
            f"and there {'is 1 directory' if n == 1 else f'are {n} directories'}; set it to "
            f"at least {format_bytes(n * slot_bytes)}",
        )
    return slot_count(ssd_bytes, n, slot_bytes) // n * slot_bytes


def _check_writable(path: str, shown: str) -> None:
    """Create and remove a probe file in ``path`` with O_DIRECT; ConfigError naming why not."""
    probe = os.path.join(path, f".miniflex-probe-{os.getpid()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        os.close(os.open(probe, flags | os.O_DIRECT, 0o600))
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise ConfigError("ssd_dirs", shown, _why_not_writable(exc, path)) from None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(probe)  # open(2) may create the file before it refuses O_DIRECT
        fs = _fs_type(path)
        raise ConfigError(
            "ssd_dirs",
            shown,
            f"its file system ({fs}) refuses O_DIRECT; give a directory on ext4 or xfs "
            "(tmpfs takes O_DIRECT from Linux 6.6 on)",
        ) from None
    os.unlink(probe)


def _why_not_writable(exc: OSError, path: str) -> str:
    if exc.errno == errno.EROFS:
        return (
            "it is on a read-only file system; remount it read-write or give a directory on "
            "a writable disk"
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (
            f"user {os.getuid()} may not create files in {path}; chown or chmod it, or give "
            "another directory"
        )
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"its file system is full ({exc.strerror}); free space or give another directory"
    return f"a file cannot be created in {path} ({exc.strerror}); give another directory"


def _check_space(
    dirs: Sequence[str],
    ssd_bytes: int,
    file_bytes: int,
    slot_bytes: int | None,
    ranks: Sequence[int],
) -> dict[str, int]:
    """Refuse when a file system lacks room for the files placed on it; free space per dir.

    Room for: each rank's data file in each directory (less what existing ones hold, a
    hybrid model's per group included), and beside the first one its journal (with a
    compaction's copy) and the start-up read probe's scratch file.
    """
    free: dict[str, int] = {}
    on_dev: dict[int, list[str]] = {}
    for d in dirs:
        vfs = os.statvfs(d)
        free[d] = vfs.f_bavail * vfs.f_frsize
        on_dev.setdefault(os.stat(d).st_dev, []).append(d)
    held = {(d, r): _held_bytes(d, r) for d in dirs for r in ranks}

    def need(on: list[str], total: int) -> int:
        """Bytes still to allocate in directories ``on`` (one file system) for a tier of
        ``total`` bytes."""
        fits = total >= len(dirs) * (slot_bytes or ALIGN)
        size = _file_bytes(dirs, total, slot_bytes) if fits else 0
        slots = size // slot_bytes if slot_bytes else size // (1 << 20)
        first = RECORD_BYTES * (1 + 5 * max(slots * len(dirs), 1024))  # journal: 4x + copy
        first += min(PROBE_BYTES, slots * len(dirs) * (slot_bytes or 1 << 20) // 4)
        return sum(
            max(0, size - held[(d, r)]) + (first if d == dirs[0] else 0) for d in on for r in ranks
        )

    for on in on_dev.values():
        d, wanted = on[0], need(on, ssd_bytes)
        if wanted <= free[d]:
            continue
        lo, hi = 0, ssd_bytes // (1 << 20)  # the largest tier, in MiB, that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if need(on, mid << 20) <= free[d] else (lo, mid - 1)
        raise ConfigError(
            "ssd_bytes",
            format_bytes(ssd_bytes),
            f"{d} has {format_bytes(free[d])} free but the SSD tier needs "
            f"{format_bytes(wanted)} more there; set it to at most {format_bytes(lo << 20)} "
            "or free disk space",
        )
    return free


def _held_bytes(d: str, rank: int) -> int:
    """What rank ``rank``'s data files under ``d`` already hold: its store's, or those of a
    hybrid model's KV cache groups (``<d>/group<g>/rank<r>``, one store per group)."""
    held = _allocated(os.path.join(rank_dirs([d], rank)[0], DATA_FILE))
    with contextlib.suppress(OSError):
        for entry in os.scandir(d):
            if entry.name.startswith("group") and entry.is_dir(follow_symlinks=False):
                held += _allocated(os.path.join(rank_dirs([entry.path], rank)[0], DATA_FILE))
    return held


def _allocated(path: str) -> int:
    try:
        return os.stat(path).st_blocks * 512
    except OSError:
        return 0


def _fs_type(path: str) -> str:
    """The type of the file system ``path`` is on (``tmpfs``, ``ext4``), from /proc/mounts."""
    real, best, kind = os.path.realpath(path), "", "unknown"
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3:
                continue
            mount = parts[1].replace("\\040", " ")
            inside = real == mount or real.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best):
                best, kind = mount, parts[2]
    return kind


def _flock_owner(inode: int) -> int | None:
    """The pid of a process holding a flock on ``inode`` (from /proc/locks), if listed."""
    with contextlib.suppress(OSError), open("/proc/locks") as f:
        for line in f:
            parts = line.split()
            # "1: FLOCK  ADVISORY  WRITE 6836 fd:00:1234 0 EOF"
            if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].endswith(f":{inode}"):
                return int(parts[4])
    return None


def _who(pid: int) -> str:
    if not pid:
        return "another process"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return f"pid {pid}"
    return f"pid {pid}: {cmd[:80]}" if cmd else f"pid {pid}"
