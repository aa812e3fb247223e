"""Opening the SSD tier's slot files: ``O_DIRECT``, mode 0600, preallocated.

Preallocating up front (``posix_fallocate``) means a full disk is reported
once, readably, when the tier starts -- not as ENOSPC in the middle of a
store. Free space is checked with ``statvfs`` before the file is even created.
"""

from __future__ import annotations

import errno
import os

from miniflex.layout import ALIGN
from miniflex.ssd.base import io_error
from miniflex.units import format_bytes

__all__ = ["open_direct", "slot_parts", "supports_direct"]


def open_direct(path: str | os.PathLike[str], size: int, create: bool = True) -> int:
    """Open ``path`` read-write with ``O_DIRECT`` and make it at least ``size`` bytes.

    Creates the file (mode 0600) if ``create``; never shrinks it. Returns the
    fd, which the caller closes. Raises :class:`~miniflex.errors.IOBackendError`
    with ``ENOSPC`` if the file system lacks the space (checked before
    creating anything), ``EINVAL`` if it refuses ``O_DIRECT`` (e.g. ramfs, or
    tmpfs before Linux 6.6), or the OS error of ``open`` (e.g. ``ENOENT``).
    ``size`` must be a multiple of 4 KiB.
    """
    name = os.fspath(path)
    if size < 0 or size % ALIGN:
        raise ValueError(f"size of {name} must be a non-negative multiple of {ALIGN}, got {size}")
    _check_space(name, size)
    flags = os.O_RDWR | os.O_DIRECT | (os.O_CREAT if create else 0)
    try:
        fd = os.open(name, flags, 0o600)
    except OSError as exc:
        err = exc.errno or errno.EIO
        hint = None
        if err == errno.EINVAL:
            hint = (
                f"the file system of {os.path.dirname(os.path.abspath(name))} does not support "
                "O_DIRECT (e.g. ramfs, or tmpfs before Linux 6.6); put SSD files on ext4/xfs"
            )
        raise io_error(err, name, 0, size, "open with O_DIRECT", hint) from exc
    try:
        _preallocate(fd, name, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def supports_direct(directory: str | os.PathLike[str]) -> bool:
    """True if ``directory``'s file system accepts ``O_DIRECT`` (a probe file is made and removed).

    False only for ``EINVAL`` (the file system refuses O_DIRECT); other errors,
    such as a missing or read-only directory, raise ``OSError``.
    """
    probe = os.path.join(os.fspath(directory), ".odirect_probe")
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    os.close(fd)
    os.unlink(probe)
    return True


def _check_space(name: str, size: int) -> None:
    directory = os.path.dirname(os.path.abspath(name))
    try:
        have = os.stat(name).st_blocks * 512
    except FileNotFoundError:
        have = 0
    try:
        vfs = os.statvfs(directory)
    except OSError as exc:
        raise io_error(exc.errno or errno.EIO, name, 0, size, "statvfs of the directory") from exc
    free = vfs.f_bavail * vfs.f_frsize
    need = size - have
    if need > free:
        raise io_error(
            errno.ENOSPC,
            name,
            0,
            size,
            "preallocate",
            f"{directory} has {format_bytes(free)} free but {format_bytes(need)} more are "
            "needed; lower the SSD tier size (ssd_bytes) or free disk space",
        )


def _preallocate(fd: int, name: str, size: int) -> None:
    if size == 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise io_error(exc.errno or errno.EIO, name, 0, size, "preallocate") from exc
        # No fallocate here (e.g. some network file systems): a sparse file still works.
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)


def slot_parts(slot_bytes: int, part_bytes: int) -> list[tuple[int, int]]:
    """Byte ranges of a slot read in parts of ``part_bytes`` (the last to the slot's end)."""
    if part_bytes <= 0 or part_bytes >= slot_bytes:
        return [(0, slot_bytes)]
    if part_bytes % ALIGN:
        raise ValueError(f"read parts of {part_bytes} bytes are not a multiple of {ALIGN}")
    last = slot_bytes - 2 * part_bytes  # parts past it run to the end
    starts = range(0, slot_bytes - part_bytes + 1, part_bytes)
    return [(lo, lo + part_bytes if lo <= last else slot_bytes) for lo in starts]
