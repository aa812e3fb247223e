"""The hand-written cffi declarations match the kernel's io_uring ABI."""

from __future__ import annotations

import pytest

from miniflex.ssd._uring_ffi import ffi, syscall_numbers


def test_struct_sizes_match_the_kernel_abi() -> None:
    assert ffi.sizeof("struct io_uring_sqe") == 64
    assert ffi.sizeof("struct io_uring_cqe") == 16
    assert ffi.sizeof("struct io_uring_params") == 120
    assert ffi.sizeof("struct io_uring_probe") == 16 + 256 * 8


def test_sqe_field_offsets_match_linux_io_uring_h() -> None:
    offsets = {
        f: ffi.offsetof("struct io_uring_sqe", f)
        for f in ("opcode", "fd", "off", "addr", "len", "rw_flags", "user_data", "addr3")
    }
    assert offsets == {
        "opcode": 0,
        "fd": 4,
        "off": 8,
        "addr": 16,
        "len": 24,
        "rw_flags": 28,
        "user_data": 32,
        "addr3": 48,
    }
    assert ffi.offsetof("struct io_uring_params", "sq_off") == 40
    assert ffi.offsetof("struct io_uring_params", "cq_off") == 80


def test_syscall_numbers_known_architectures_only() -> None:
    assert tuple(syscall_numbers("x86_64")) == (425, 426, 427)
    assert tuple(syscall_numbers("aarch64")) == (425, 426, 427)
    with pytest.raises(NotImplementedError, match="not riscv64; use the 'threads' backend"):
        syscall_numbers("riscv64")
