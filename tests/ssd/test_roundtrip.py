"""Reads and writes through either backend: bit-exact, many ops in flight, short I/O, errors."""

from __future__ import annotations

import errno
import itertools
import os
from pathlib import Path

import numpy as np
import pytest

from miniflex.errors import IOBackendError
from miniflex.layout import ALIGN
from miniflex.ssd import IOBackend, IOOp, open_direct
from tests.ssd.conftest import QUEUE_DEPTH, aligned, random_bytes

MIB = 1 << 20


def scattered_layout(n_ops: int, seed: int) -> tuple[list[int], list[int], int]:
    """Sizes of 4 KiB..8 MiB (log-uniform) at random aligned, disjoint offsets, shuffled."""
    rng = np.random.default_rng(seed)
    pages = np.exp(rng.uniform(0, np.log(2048), n_ops)).astype(int).clip(1, 2048)
    pages[:2] = (1, 2048)  # always both extremes
    sizes = [int(p) * ALIGN for p in pages]
    gaps = rng.integers(0, 8, n_ops) * ALIGN
    offsets, at = [], 0
    for size, gap in zip(sizes, gaps, strict=True):
        at += int(gap)
        offsets.append(at)
        at += size
    order = rng.permutation(n_ops)
    return [sizes[i] for i in order], [offsets[i] for i in order], at


def test_many_random_ops_round_trip_bit_exact(backend: IOBackend, direct_dir: Path) -> None:
    n_ops = 500
    sizes, offsets, file_size = scattered_layout(n_ops, seed=7)
    assert n_ops > 10 * QUEUE_DEPTH
    path = str(direct_dir / "slots.dat")
    fd = open_direct(path, file_size)
    try:
        starts = np.cumsum([0, *sizes])
        src = random_bytes(int(starts[-1]), seed=1)
        dst = aligned(int(starts[-1]))
        spans = list(zip(offsets, itertools.pairwise(int(s) for s in starts), strict=True))
        backend.run([IOOp(fd, path, o, memoryview(src[a:b]), True) for o, (a, b) in spans])
        backend.run([IOOp(fd, path, o, memoryview(dst[a:b]), False) for o, (a, b) in spans])
    finally:
        os.close(fd)
    assert np.array_equal(src, dst)


def test_empty_batch_is_a_no_op(backend: IOBackend, direct_dir: Path) -> None:
    """``run([])`` returns at once, touches nothing, and leaves the backend usable."""
    path = str(direct_dir / "empty.dat")
    fd = open_direct(path, MIB)
    src, dst = random_bytes(MIB, seed=5), aligned(MIB)
    try:
        backend.run([IOOp(fd, path, 0, memoryview(src), True)])
        assert backend.run([]) is None
        assert not backend.closed
        backend.run([IOOp(fd, path, 0, memoryview(dst), False)])
    finally:
        os.close(fd)
    assert np.array_equal(src, dst)


def test_read_past_eof_is_an_error_naming_the_op(backend: IOBackend, direct_dir: Path) -> None:
    path = str(direct_dir / "one_mib.dat")
    fd = open_direct(path, MIB)
    buf = aligned(2 * MIB)
    try:
        with pytest.raises(IOBackendError) as info:
            backend.run([IOOp(fd, path, 0, memoryview(buf), False)])  # 1 MiB arrives, then EOF
        err = info.value
        assert (err.errno, err.path, err.offset, err.length, err.op) == (
            errno.ENODATA,
            path,
            0,
            2 * MIB,
            "read",
        )
        assert f"after {MIB} of {2 * MIB} bytes" in str(err)
        with pytest.raises(IOBackendError) as info:
            backend.run([IOOp(fd, path, 4 * MIB, memoryview(buf[:MIB]), False)])  # wholly past EOF
        assert (info.value.offset, info.value.length) == (4 * MIB, MIB)
    finally:
        os.close(fd)


def test_short_read_of_an_unaligned_tail_is_resumed_then_reported(
    backend: IOBackend, tmp_path: Path
) -> None:
    path = tmp_path / "tail.bin"
    path.write_bytes(b"t" * 6000)
    fd = os.open(path, os.O_RDONLY)  # buffered: no alignment rules
    buf = bytearray(8192)
    try:
        with pytest.raises(IOBackendError, match="after 6000 of 8192 bytes") as info:
            backend.run([IOOp(fd, str(path), 0, memoryview(buf), False)])
    finally:
        os.close(fd)
    assert info.value.errno == errno.ENODATA
    assert buf[:6000] == b"t" * 6000


def test_write_to_read_only_fd_names_path_offset_length_op(
    backend: IOBackend, direct_dir: Path
) -> None:
    path = str(direct_dir / "ro.dat")
    os.close(open_direct(path, 16 * MIB))
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = random_bytes(MIB, seed=3)
    reads = [IOOp(fd, path, i * MIB, memoryview(aligned(MIB)), False) for i in range(12)]
    bad = IOOp(fd, path, 5 * MIB, memoryview(buf), True)
    try:
        with pytest.raises(IOBackendError) as info:
            backend.run([*reads[:5], bad, *reads[6:]])
        err = info.value
        assert (err.errno, err.path, err.offset, err.length, err.op) == (
            errno.EBADF,
            path,
            5 * MIB,
            MIB,
            "write",
        )
        assert path in str(err) and "write of 1048576 bytes at offset 5242880" in str(err)
        backend.run(reads)  # a failed batch leaves the backend usable
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("offset", "length", "shift"),
    [(512, ALIGN, 0), (0, 1000, 0), (0, ALIGN, 512)],
    ids=["offset", "length", "address"],
)
def test_misaligned_direct_op_is_a_readable_value_error(
    backend: IOBackend, direct_dir: Path, offset: int, length: int, shift: int
) -> None:
    path = str(direct_dir / "a.dat")
    fd = open_direct(path, MIB)
    buf = aligned(2 * ALIGN)[shift : shift + length]
    try:
        with pytest.raises(ValueError, match="multiples of 4096"):
            backend.run([IOOp(fd, path, offset, memoryview(buf), True)])
    finally:
        os.close(fd)


def test_malformed_ops_are_rejected_when_built() -> None:
    with pytest.raises(ValueError, match="read-only buffer"):
        IOOp(0, "x", 0, memoryview(b"abc"), False)
    with pytest.raises(ValueError, match="C-contiguous"):
        IOOp(0, "x", 0, memoryview(aligned(8192)[::2]), True)
    with pytest.raises(ValueError, match="offset -4096 must be >= 0"):
        IOOp(0, "x", -4096, memoryview(aligned(4096)), True)
    words = IOOp(0, "x", 0, memoryview(aligned(8192).view(np.uint64).reshape(32, 32)), True)
    assert (words.length, words.buf.format, words.op) == (8192, "B", "write")


def test_lowest_failed_index_is_reported_and_earlier_ops_completed(
    backend: IOBackend, direct_dir: Path
) -> None:
    path = str(direct_dir / "mixed.dat")
    fd = open_direct(path, 32 * MIB)
    ro = os.open(path, os.O_RDONLY | os.O_DIRECT)
    src = random_bytes(32 * MIB, seed=9)
    ops = [IOOp(fd, path, i * MIB, memoryview(src[i * MIB :][:MIB]), True) for i in range(32)]
    for bad in (12, 6):  # two doomed writes in one queue-depth window: report index 6
        ops[bad] = IOOp(ro, path, bad * MIB, memoryview(src[bad * MIB :][:MIB]), True)
    try:
        with pytest.raises(IOBackendError) as info:
            backend.run(ops)
        assert (info.value.offset, info.value.errno) == (6 * MIB, errno.EBADF)
        dst = aligned(6 * MIB)
        backend.run([IOOp(fd, path, 0, memoryview(dst), False)])
        assert np.array_equal(dst, src[: 6 * MIB])  # ops[:6] all completed
    finally:
        os.close(ro)
        os.close(fd)
