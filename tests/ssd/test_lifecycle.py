"""Closing, interrupting and waiting: no op outlives ``run``/``close``, and waits free the GIL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from miniflex.ssd import BackendError, IOBackend, IOOp, UringBackend, make_backend, open_direct
from tests.ssd.conftest import aligned, random_bytes

MIB = 1 << 20


class Interrupted(Exception):
    """What the SIGALRM handler raises in the middle of ``run``."""


@pytest.fixture
def alarm() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGALRM)

    def raise_interrupted(signum: int, frame: object) -> None:
        raise Interrupted

    signal.signal(signal.SIGALRM, raise_interrupted)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def delayed_writer(fd: int, chunks: list[bytes], delay: float) -> subprocess.Popen[bytes]:
    """Another *process* writes ``chunks`` to ``fd`` ``delay`` s apart, whatever our GIL does."""
    code = (
        "import sys, time\n"
        f"for chunk in {chunks!r}:\n"
        f"    time.sleep({delay})\n"
        "    sys.stdout.buffer.write(chunk); sys.stdout.buffer.flush()\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=fd)


def wait_until_running(backend: IOBackend, timeout: float = 10.0) -> None:
    """Block until another thread's ``run`` holds the backend (its private batch lock)."""
    deadline = time.monotonic() + timeout
    while not backend._lock.locked():  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "run() never started"
        time.sleep(0.001)


def test_close_is_idempotent_and_use_after_close_is_readable(
    backend: IOBackend, direct_dir: Path
) -> None:
    path = str(direct_dir / "c.dat")
    fd = open_direct(path, MIB)
    try:
        backend.run([IOOp(fd, path, 0, memoryview(aligned(MIB)), True)])
        backend.close()
        backend.close()
        assert backend.closed
        with pytest.raises(BackendError, match=f"the {backend.name} I/O backend is closed"):
            backend.run([IOOp(fd, path, 0, memoryview(aligned(MIB)), False)])
    finally:
        os.close(fd)


def test_close_from_another_thread_waits_for_the_running_batch(
    backend: IOBackend, direct_dir: Path
) -> None:
    n, size = 64, 4 * MIB
    path = str(direct_dir / "big.dat")
    fd = open_direct(path, n * size)
    src = random_bytes(n * size, seed=11)
    ops = [
        IOOp(fd, path, i * size, memoryview(src[i * size : (i + 1) * size]), True) for i in range(n)
    ]
    finished: list[float] = []
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            backend.run(ops)
        except BaseException as exc:
            errors.append(exc)
        finished.append(time.perf_counter())

    t = threading.Thread(target=writer)
    t.start()
    wait_until_running(backend)
    backend.close()
    closed_at = time.perf_counter()
    t.join(timeout=30)
    try:
        assert not t.is_alive(), "run never returned after close()"
        assert errors == [] and finished[0] <= closed_at
        dst = aligned(n * size)
        with make_backend(backend.name, 4) as check:
            check.run([IOOp(fd, path, 0, memoryview(dst), False)])
        assert np.array_equal(src, dst)
    finally:
        os.close(fd)


def test_interrupted_run_returns_only_after_in_flight_ops_finish(
    backend: IOBackend, direct_dir: Path, alarm: None
) -> None:
    """SIGALRM raises mid-batch; afterwards nothing may still write into the buffer."""
    n, size = 32, 8 * MIB
    path = str(direct_dir / "int.dat")
    fd = open_direct(path, n * size)
    try:
        src = random_bytes(n * size, seed=5)
        # One op per worker first, so no thread is being created when the signal lands.
        backend.run(
            [IOOp(fd, path, i * size, memoryview(src[i * size :][:size]), True) for i in range(n)]
        )
        dst = aligned(n * size)
        signal.setitimer(signal.ITIMER_REAL, 0.02)
        with pytest.raises(Interrupted):
            backend.run(
                [
                    IOOp(fd, path, i * size, memoryview(dst[i * size :][:size]), False)
                    for i in range(n)
                ]
            )
        snapshot = dst.copy()
        time.sleep(0.2)
        assert np.array_equal(snapshot, dst), "an op was still in flight after run raised"
        backend.run([IOOp(fd, path, 0, memoryview(dst[:size]), False)])  # still usable
    finally:
        os.close(fd)


def test_uring_interrupt_waits_for_a_blocked_op(uring: UringBackend, alarm: None) -> None:
    r, w = os.pipe()
    buf = bytearray(4096)
    writer = delayed_writer(w, [b"p" * 4096], delay=0.5)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        t0 = time.perf_counter()
        with pytest.raises(Interrupted):
            uring.run([IOOp(r, "pipe", 0, memoryview(buf), False)])
        assert time.perf_counter() - t0 >= 0.4  # drained, not abandoned
        assert buf == b"p" * 4096
    finally:
        writer.wait()
        os.close(r)
        os.close(w)


def test_uring_resumes_a_short_read(uring: UringBackend) -> None:
    r, w = os.pipe()
    buf = bytearray(8192)
    writer = delayed_writer(w, [b"a" * 4096, b"b" * 4096], delay=0.1)
    try:
        uring.run([IOOp(r, "pipe", 0, memoryview(buf), False)])  # first CQE: 4096 of 8192
    finally:
        writer.wait()
        os.close(r)
        os.close(w)
    assert buf == b"a" * 4096 + b"b" * 4096


def test_uring_close_from_another_thread_waits_for_a_blocked_op(uring: UringBackend) -> None:
    r, w = os.pipe()
    buf = bytearray(4096)
    done: list[int] = []

    def reader() -> None:
        uring.run([IOOp(r, "pipe", 0, memoryview(buf), False)])
        done.append(1)

    t = threading.Thread(target=reader)
    writer = delayed_writer(w, [b"c" * 4096], delay=0.5)
    try:
        t.start()
        wait_until_running(uring)
        uring.close()  # must wait: the kernel still holds ``buf``
        assert done == [1] and buf == b"c" * 4096
        t.join(timeout=30)
    finally:
        writer.wait()
        os.close(r)
        os.close(w)


def test_uring_wait_releases_the_gil(uring: UringBackend, alarm: None) -> None:
    """The data ``run`` waits for comes from a Python thread of this process, which can only
    run while ``run`` blocks in io_uring_enter if that wait releases the GIL; were it held,
    the alarm would end the wait (a deadlock, not a slow run: no timing threshold)."""
    r, w = os.pipe()
    buf = bytearray(4096)

    def writer() -> None:
        wait_until_running(uring)
        time.sleep(0.2)  # run is blocked in the kernel by now; waking up needs the GIL
        os.write(w, b"g" * 4096)

    t = threading.Thread(target=writer)
    t.start()
    signal.setitimer(signal.ITIMER_REAL, 20)
    try:
        uring.run([IOOp(r, "pipe", 0, memoryview(buf), False)])
    except Interrupted:
        pytest.fail("run() kept the GIL while it waited: the writer thread never ran")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        t.join(timeout=30)
        os.close(r)
        os.close(w)
    assert buf == b"g" * 4096
