"""cffi ABI-mode declarations of the io_uring kernel interface (no compiler, no liburing).

Only declarations and constants live here; :mod:`miniflex.ssd._ring` holds the
logic. Struct layouts follow ``include/uapi/linux/io_uring.h``; unions are
flattened to the one member MiniFlex uses, which keeps every offset and the
64-byte SQE size intact (``tests/ssd/test_uring.py`` checks the sizes).
"""

from __future__ import annotations

import functools
import platform
from typing import Any, NamedTuple

import cffi

__all__ = [
    "IORING_ENTER_GETEVENTS",
    "IORING_FEAT_SINGLE_MMAP",
    "IORING_OFF_CQ_RING",
    "IORING_OFF_SQES",
    "IORING_OFF_SQ_RING",
    "IORING_OP_NOP",
    "IORING_OP_READ",
    "IORING_OP_WRITE",
    "IORING_REGISTER_PROBE",
    "IO_URING_OP_SUPPORTED",
    "MAP_FAILED",
    "MAP_POPULATE",
    "MAP_SHARED",
    "PROT_READ",
    "PROT_WRITE",
    "SyscallNumbers",
    "ffi",
    "libc",
    "syscall_numbers",
]

ffi = cffi.FFI()
ffi.cdef(
    """
    struct io_sqring_offsets {
        uint32_t head, tail, ring_mask, ring_entries, flags, dropped, array, resv1;
        uint64_t user_addr;
    };
    struct io_cqring_offsets {
        uint32_t head, tail, ring_mask, ring_entries, overflow, cqes, flags, resv1;
        uint64_t user_addr;
    };
    struct io_uring_params {
        uint32_t sq_entries, cq_entries, flags, sq_thread_cpu, sq_thread_idle;
        uint32_t features, wq_fd, resv[3];
        struct io_sqring_offsets sq_off;
        struct io_cqring_offsets cq_off;
    };
    struct io_uring_sqe {
        uint8_t opcode;
        uint8_t flags;
        uint16_t ioprio;
        int32_t fd;
        uint64_t off;
        uint64_t addr;
        uint32_t len;
        uint32_t rw_flags;
        uint64_t user_data;
        uint16_t buf_index;
        uint16_t personality;
        int32_t splice_fd_in;
        uint64_t addr3;
        uint64_t pad2[1];
    };
    struct io_uring_cqe {
        uint64_t user_data;
        int32_t res;
        uint32_t flags;
    };
    struct io_uring_probe_op {
        uint8_t op, resv;
        uint16_t flags;
        uint32_t resv2;
    };
    struct io_uring_probe {
        uint8_t last_op, ops_len;
        uint16_t resv;
        uint32_t resv2[3];
        struct io_uring_probe_op ops[256];
    };
    long syscall(long number, ...);
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset);
    int munmap(void *addr, size_t length);
    """
)

IORING_OP_NOP = 0
IORING_OP_READ = 22
IORING_OP_WRITE = 23
IORING_ENTER_GETEVENTS = 1
IORING_OFF_SQ_RING = 0
IORING_OFF_CQ_RING = 0x8000000
IORING_OFF_SQES = 0x10000000
IORING_FEAT_SINGLE_MMAP = 1
IORING_REGISTER_PROBE = 8
IO_URING_OP_SUPPORTED = 1

PROT_READ = 1
PROT_WRITE = 2
MAP_SHARED = 1
MAP_POPULATE = 0x8000  # same value in the x86_64 and the generic (aarch64) headers
MAP_FAILED = -1


class SyscallNumbers(NamedTuple):
    """The three io_uring syscall numbers of one architecture."""

    setup: int
    enter: int
    register: int


# x86_64 and the generic table (aarch64) happen to agree on 425..427.
_SYSCALLS = {"x86_64": (425, 426, 427), "aarch64": (425, 426, 427)}


def syscall_numbers(machine: str | None = None) -> SyscallNumbers:
    """io_uring syscall numbers for ``machine`` (default: this one).

    Raises ``NotImplementedError`` naming the architecture elsewhere, because a
    wrong number would call an unrelated syscall.
    """
    machine = machine or platform.machine()
    if machine not in _SYSCALLS:
        raise NotImplementedError(
            f"MiniFlex's io_uring backend knows the syscall numbers of "
            f"{', '.join(sorted(_SYSCALLS))} only, not {machine}; use the 'threads' backend"
        )
    return SyscallNumbers(*_SYSCALLS[machine])


@functools.cache
def libc() -> Any:
    """The C library, opened once on first use (not at import time)."""
    return ffi.dlopen(None)
