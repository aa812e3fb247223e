"""One raw io_uring instance driven through cffi: setup, ring mmaps, SQEs, enter, CQEs.

No liburing and no compiler: the kernel ABI is used directly
(:mod:`miniflex.ssd._uring_ffi`). A :class:`Ring` is not thread-safe; its
owner (:class:`~miniflex.ssd.uring.UringBackend`) serializes access.

Memory ordering. The SQ tail and CQ head/tail are read and written through
cffi ``uint32_t *`` pointers into the shared mapping; every access is a fresh
load or store (cffi never caches), i.e. it behaves like a volatile access, and
each is an opaque C call, so neither the C compiler nor CPython reorders them.

* SQ: SQEs and their array slots are written first, the tail is stored last
  (:meth:`Ring.publish`), and the kernel reads the SQ only inside our own
  ``io_uring_enter`` call (no SQPOLL thread), i.e. on the same thread, where
  program order is all that is needed on any architecture.
* CQ: we load the tail, then the CQEs below it, then store the head. On
  x86_64 (TSO: loads are not reordered with loads, stores not with stores)
  that is the ``smp_load_acquire``/``smp_store_release`` pair liburing uses.
  **aarch64 assumption:** ABI-mode cffi cannot emit ``dmb``/``ldar``, so we
  rely on READ/WRITE completions being posted by task_work that runs on the
  submitting thread (inside ``io_uring_enter`` or on its return to user
  space), which is what kernels >= 5.x do for block and regular-file I/O. A
  CQE posted from another CPU (e.g. an io-wq worker completing a request
  inline) would formally need an acquire barrier; if aarch64 must be airtight,
  create the ring with ``IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN``
  (Linux >= 6.1), which makes the kernel post *every* CQE from the submitter's
  ``io_uring_enter`` -- at the price of tying the ring to one thread.
  Untested on aarch64.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from miniflex.ssd import _uring_ffi as u
from miniflex.ssd._uring_ffi import ffi
from miniflex.ssd.base import BackendError, BackendUnavailableError

__all__ = ["Ring"]

_U32 = 0xFFFFFFFF
_RETRY = (errno.EINTR, errno.EAGAIN, errno.EBUSY)


def _long(value: int) -> Any:
    """glibc's ``syscall()`` reads every variadic argument as a ``long``."""
    return ffi.cast("long", value)


def _unavailable(err: int, what: str) -> BackendUnavailableError:
    hint = {
        errno.ENOSYS: "the kernel lacks io_uring or a seccomp filter blocks it",
        errno.EPERM: "io_uring is disabled (sysctl kernel.io_uring_disabled) or forbidden",
        errno.EINVAL: "the queue depth or a flag is out of range for this kernel",
        errno.ENOMEM: "not enough locked memory (ulimit -l) for the rings",
    }.get(err, "")
    detail = f" ({hint})" if hint else ""
    return BackendUnavailableError(err, f"{what} failed: {os.strerror(err)}{detail}")


class Ring:
    """An io_uring with ``entries`` SQ slots; each SQE yields exactly one CQE."""

    def __init__(self, entries: int) -> None:
        try:
            self._nr = u.syscall_numbers()
        except NotImplementedError as exc:
            raise BackendUnavailableError(errno.ENOSYS, str(exc)) from exc
        self._lib = u.libc()
        params = ffi.new("struct io_uring_params *")
        fd = self._lib.syscall(self._nr.setup, _long(entries), params)
        if fd < 0:
            raise _unavailable(ffi.errno, f"io_uring_setup(entries={entries})")
        self.fd = int(fd)
        self._open = True
        self._maps: list[tuple[Any, int]] = []
        try:
            self._map_rings(params)
        except BaseException:
            self.close()
            raise
        # Local counters, unbounded; the shared u32 indices are these mod 2**32. How
        # many SQEs the kernel consumed is read from its SQ head, never counted here:
        # a signal handler raising right after io_uring_enter returns would lose
        # such a count (see tests/ssd/test_lifecycle.py).
        self._pushed = 0  # SQEs written (local SQ tail)
        self._reaped = 0  # CQEs consumed (local CQ head)

    def _mmap(self, size: int, offset: int) -> Any:
        prot, flags = u.PROT_READ | u.PROT_WRITE, u.MAP_SHARED | u.MAP_POPULATE
        ptr = self._lib.mmap(ffi.NULL, size, prot, flags, self.fd, offset)
        if int(ffi.cast("intptr_t", ptr)) == u.MAP_FAILED:
            raise _unavailable(ffi.errno, f"mmap of the io_uring region at {offset:#x}")
        self._maps.append((ptr, size))
        return ffi.cast("char *", ptr)

    def _map_rings(self, p: Any) -> None:
        sq_size = p.sq_off.array + p.sq_entries * ffi.sizeof("uint32_t")
        cq_size = p.cq_off.cqes + p.cq_entries * ffi.sizeof("struct io_uring_cqe")
        single = bool(p.features & u.IORING_FEAT_SINGLE_MMAP)
        if single:
            sq_size = cq_size = max(sq_size, cq_size)
        sq = self._mmap(sq_size, u.IORING_OFF_SQ_RING)
        cq = sq if single else self._mmap(cq_size, u.IORING_OFF_CQ_RING)
        sqes = self._mmap(p.sq_entries * ffi.sizeof("struct io_uring_sqe"), u.IORING_OFF_SQES)

        def u32(base: Any, offset: int) -> Any:
            return ffi.cast("uint32_t *", base + offset)

        self.entries = int(p.sq_entries)
        self._sq_head = u32(sq, p.sq_off.head)
        self._sq_tail = u32(sq, p.sq_off.tail)
        self._sq_mask = int(u32(sq, p.sq_off.ring_mask)[0])
        self._sq_array = u32(sq, p.sq_off.array)
        self._sqes = ffi.cast("struct io_uring_sqe *", sqes)
        self._cq_head = u32(cq, p.cq_off.head)
        self._cq_tail = u32(cq, p.cq_off.tail)
        self._cq_mask = int(u32(cq, p.cq_off.ring_mask)[0])
        self._cqes = ffi.cast("struct io_uring_cqe *", cq + p.cq_off.cqes)
        self._zero_sqe = ffi.new("struct io_uring_sqe *")

    @property
    def outstanding(self) -> int:
        """SQEs written whose CQE has not been reaped (in flight or not yet submitted)."""
        return self._pushed - self._reaped

    def _unsubmitted(self) -> int:
        return (self._pushed - int(self._sq_head[0])) & _U32

    def push(
        self, opcode: int, fd: int, offset: int, addr: int, length: int, user_data: int
    ) -> None:
        """Write one SQE; it is submitted by the next :meth:`enter`."""
        assert self._unsubmitted() < self.entries, "SQ full: enter() first"
        idx = self._pushed & self._sq_mask
        sqe = self._sqes + idx
        ffi.memmove(sqe, self._zero_sqe, ffi.sizeof("struct io_uring_sqe"))
        sqe.opcode = opcode
        sqe.fd = fd
        sqe.off = offset
        sqe.addr = addr
        sqe.len = length
        sqe.user_data = user_data
        self._sq_array[idx] = idx
        self._pushed += 1

    def enter(self, min_complete: int) -> None:
        """Publish pushed SQEs, submit them and wait for ``min_complete`` CQEs.

        The wait happens in the kernel with the GIL released (cffi releases
        it around every foreign call). Returns early without error on EINTR
        (so Python signal handlers run), EAGAIN or EBUSY; callers loop.
        """
        self._sq_tail[0] = self._pushed & _U32  # store the tail after the SQEs
        to_submit = self._unsubmitted()
        flags = u.IORING_ENTER_GETEVENTS if min_complete else 0
        ret = self._lib.syscall(
            self._nr.enter,
            _long(self.fd),
            _long(to_submit),
            _long(min_complete),
            _long(flags),
            ffi.NULL,
            _long(0),
        )
        if ret < 0:
            err = ffi.errno
            if err in _RETRY:
                return
            raise BackendError(err, f"io_uring_enter failed: {os.strerror(err)}")

    def reap(self) -> list[tuple[int, int]]:
        """Consume every visible CQE; return ``(user_data, res)`` pairs."""
        tail = int(self._cq_tail[0])  # load the tail before the CQEs
        count = (tail - self._reaped) & _U32
        done = []
        for i in range(self._reaped, self._reaped + count):
            cqe = self._cqes[i & self._cq_mask]
            done.append((int(cqe.user_data), int(cqe.res)))
        self._reaped += count
        self._cq_head[0] = self._reaped & _U32  # hand the slots back after reading them
        return done

    def supports(self, opcodes: tuple[int, ...]) -> bool:
        """Ask the kernel (IORING_REGISTER_PROBE, Linux >= 5.6) whether it has ``opcodes``."""
        probe = ffi.new("struct io_uring_probe *")
        ret = self._lib.syscall(
            self._nr.register, _long(self.fd), _long(u.IORING_REGISTER_PROBE), probe, _long(256)
        )
        if ret < 0:
            return False
        return all(
            op <= probe.last_op and probe.ops[op].flags & u.IO_URING_OP_SUPPORTED for op in opcodes
        )

    def close(self) -> None:
        """Unmap the rings and close the fd; the caller has reaped everything first."""
        for ptr, size in self._maps:
            self._lib.munmap(ptr, size)
        self._maps.clear()
        if self._open:
            self._open = False
            os.close(self.fd)
