"""The SSD block-I/O interface: a batch of reads/writes of aligned chunk slots.

The SSD tier stores each chunk in a 4 KiB-aligned slot of a preallocated file
opened with ``O_DIRECT`` (see :func:`miniflex.ssd.files.open_direct`). It hands
a backend a batch of :class:`IOOp` and waits for the whole batch; the backend
(io_uring or a thread pool) decides how many are in flight at once.

Example: write two 1 MiB slots from a :class:`~miniflex.pool.HostPool`, read one back::

    with make_backend() as io:
        io.run([IOOp(fd, path, 0, memoryview(pool.slot(0)), write=True),
                IOOp(fd, path, 1 << 20, memoryview(pool.slot(1)), write=True)])
        io.run([IOOp(fd, path, 1 << 20, memoryview(pool.slot(2)), write=False)])
"""

from __future__ import annotations

import errno
import fcntl
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from miniflex.errors import IOBackendError, MiniFlexError
from miniflex.layout import ALIGN
from miniflex.ssd._uring_ffi import ffi

__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "IOBackend",
    "IOOp",
    "buffer_address",
    "check_ops",
    "io_error",
    "short_transfer_error",
]


class BackendError(MiniFlexError, OSError):
    """The backend itself failed or was used after :meth:`IOBackend.close`."""


class BackendUnavailableError(BackendError):
    """This backend cannot run here (kernel too old, io_uring disabled, seccomp, limits)."""


@dataclass(frozen=True, eq=False)
class IOOp:
    """One read or write of ``len(buf)`` bytes at ``offset`` of an open file.

    ``buf`` is a ``memoryview`` of C-contiguous memory, e.g.
    ``memoryview(pool.slot(i))``, stored flattened to bytes (other buffer
    objects are wrapped too, but type checkers want a memoryview). Holding the
    buffer, not a raw address, keeps its memory alive while the op is in
    flight: an ``mmap`` or :class:`~miniflex.pool.HostPool` cannot be unmapped
    under a pending op. ``path`` is only used in error messages. For a read the
    buffer must be writable. With ``O_DIRECT`` fds, ``offset``, ``len(buf)``
    and the buffer's address must be multiples of 4 KiB (see :func:`check_ops`).
    """

    fd: int
    path: str
    offset: int
    buf: memoryview
    write: bool

    def __post_init__(self) -> None:
        view = memoryview(self.buf)
        if not view.c_contiguous:
            raise ValueError(f"IOOp buffer for {self.path} must be C-contiguous")
        flat = view if view.format == "B" and view.ndim == 1 else view.cast("B")
        object.__setattr__(self, "buf", flat)
        if self.offset < 0 or flat.nbytes == 0:
            raise ValueError(
                f"IOOp on {self.path}: offset {self.offset} must be >= 0 and the buffer non-empty"
            )
        if not self.write and flat.readonly:
            raise ValueError(f"IOOp read into a read-only buffer (file {self.path})")

    @property
    def length(self) -> int:
        return self.buf.nbytes

    @property
    def op(self) -> str:
        """``"write"`` or ``"read"``, as in :class:`~miniflex.errors.IOBackendError`."""
        return "write" if self.write else "read"


def buffer_address(buf: memoryview) -> int:
    """Address of the first byte of a C-contiguous buffer."""
    return int(ffi.cast("uintptr_t", ffi.from_buffer(buf)))


def io_error(
    errno_: int, path: str, offset: int, length: int, op: str, hint: str | None = None
) -> IOBackendError:
    """An :class:`IOBackendError`, optionally with a sentence on what to do appended."""
    err = IOBackendError(errno_, path, offset, length, op)
    if hint:
        err.strerror = f"{err.strerror}; {hint}"
        err.args = (errno_, err.strerror)
    return err


def short_transfer_error(op: IOOp, done: int) -> IOBackendError:
    """The error for a read that hit EOF (or a write that made no progress) after ``done`` bytes."""
    if op.write:
        return io_error(errno.EIO, op.path, op.offset, op.length, op.op, f"wrote {done} bytes")
    return io_error(
        errno.ENODATA,
        op.path,
        op.offset,
        op.length,
        op.op,
        f"short read: the file ends after {done} of {op.length} bytes",
    )


def check_ops(ops: Sequence[IOOp]) -> None:
    """Raise ``ValueError`` for an op an ``O_DIRECT`` fd would reject with a bare EINVAL.

    Each distinct fd is asked for its flags once; a closed fd raises
    :class:`IOBackendError` (EBADF) naming the op.
    """
    direct: dict[int, bool] = {}
    for op in ops:
        if op.fd not in direct:
            try:
                direct[op.fd] = bool(fcntl.fcntl(op.fd, fcntl.F_GETFL) & os.O_DIRECT)
            except OSError as exc:
                raise io_error(
                    exc.errno or errno.EBADF, op.path, op.offset, op.length, op.op
                ) from exc
        if not direct[op.fd]:
            continue
        address = buffer_address(op.buf)
        if op.offset % ALIGN or op.length % ALIGN or address % ALIGN:
            raise ValueError(
                f"O_DIRECT {op.op} of {op.length} bytes at offset {op.offset} in {op.path} "
                f"from buffer address {address:#x}: offset, length and address must all be "
                f"multiples of {ALIGN} (use HostPool slots or align_up)"
            )


class IOBackend(ABC):
    """Runs batches of :class:`IOOp`; one instance per worker, shared by its threads.

    A backend owns kernel resources (a ring or threads), not the files: callers
    open and close fds themselves and must keep them open while a batch runs.
    Use it as a context manager or call :meth:`close`.
    """

    @property
    @abstractmethod
    def name(self) -> str:
        """Registry name: ``"io_uring"`` or ``"threads"``."""

    @property
    @abstractmethod
    def queue_depth(self) -> int:
        """Most ops (including resumed remainders of short transfers) in flight at once."""

    @property
    @abstractmethod
    def closed(self) -> bool:
        """True once :meth:`close` has run."""

    @abstractmethod
    def run(self, ops: Sequence[IOOp]) -> None:
        """Perform every op of ``ops``; return when all completed. ``[]`` is a no-op.

        Contract:

        * Called from any thread; concurrent calls on one backend are serialized.
        * Ops start in list order, at most :attr:`queue_depth` at a time, and
          complete in any order, so ops of one batch must not write overlapping
          file ranges or share a read buffer.
        * Every op moves exactly ``op.length`` bytes. A short transfer is resumed
          for the remainder; one that moves nothing (a read at or past EOF) fails
          with ``ENODATA``. Short transfers are never silently accepted.
        * When op ``k`` fails, no op after ``k`` is started any more; ops in
          flight are waited for; then :class:`~miniflex.errors.IOBackendError`
          is raised for the failed op with the lowest index ``j``, naming its
          path, offset, length (of the whole op) and ``"read"``/``"write"``.
          Ops ``[:j]`` all completed; targets of the others are unspecified.
          Which error is raised does not depend on timing.
        * Whatever is raised (also ``KeyboardInterrupt``), ``run`` returns only
          once no op is in flight, so every buffer may be freed afterwards.
        * Raises ``ValueError`` before starting anything if an op is misaligned
          for ``O_DIRECT`` (:func:`check_ops`), and :class:`BackendError` after
          :meth:`close`.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the backend; idempotent and safe from any thread.

        Waits for a :meth:`run` in progress in another thread to finish (its
        ops complete normally), then frees the ring or threads. Afterwards
        :meth:`run` raises :class:`BackendError`.
        """

    def _closed_error(self) -> BackendError:
        return BackendError(errno.EBADF, f"the {self.name} I/O backend is closed")

    def __enter__(self) -> IOBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"queue_depth={self.queue_depth}"
        return f"<{type(self).__name__} {self.name} {state}>"
