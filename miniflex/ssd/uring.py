"""The io_uring backend: one ring per backend, up to ``queue_depth`` ops in flight.

``run`` keeps the ring full: it pushes ops until ``queue_depth`` are in flight,
enters the kernel once to submit them and wait for at least one completion
(GIL released), reaps every visible CQE, resumes short transfers, and refills.
Error and interrupt handling follow :meth:`miniflex.ssd.base.IOBackend.run`;
the ring's own counters (SQEs pushed vs. CQEs reaped) decide when nothing is
in flight any more, so an interrupt between two bytecodes cannot lose an op.
See :mod:`miniflex.ssd._ring` for the memory-ordering assumptions.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from miniflex.errors import IOBackendError
from miniflex.ssd import _uring_ffi as u
from miniflex.ssd._ring import Ring
from miniflex.ssd._uring_ffi import ffi
from miniflex.ssd.base import (
    BackendUnavailableError,
    IOBackend,
    IOOp,
    check_ops,
    short_transfer_error,
)

__all__ = ["UringBackend"]

# An SQE's length is a u32 and Linux moves at most ~2 GiB per call anyway; bigger
# ops go in 1 GiB pieces through the short-transfer path.
_MAX_SQE_BYTES = 1 << 30


@dataclass
class _Pending:
    """An op of the current batch, possibly partly done after short transfers."""

    index: int
    op: IOOp
    keep: Any  # the cffi buffer handle: keeps ``op.buf`` exported while in flight
    address: int
    done: int = 0


class UringBackend(IOBackend):
    """Batched O_DIRECT reads/writes through a raw io_uring (Linux >= 5.6).

    Raises :class:`BackendUnavailableError` from the constructor when the ring
    cannot be set up (ENOSYS, EPERM from ``kernel.io_uring_disabled`` or
    seccomp, EINVAL for a queue depth above the kernel's limit) or lacks
    IORING_OP_READ/WRITE.
    """

    def __init__(self, queue_depth: int = 64) -> None:
        if queue_depth < 1:
            raise ValueError(f"io_uring queue_depth must be >= 1, got {queue_depth}")
        self._ring: Ring | None = Ring(queue_depth)
        self._depth = queue_depth
        self._lock = threading.Lock()
        self._inflight: dict[int, _Pending] = {}
        self._next_id = 1
        try:
            self._self_test()
        except BaseException:
            self.close()
            raise

    @property
    def name(self) -> str:
        return "io_uring"

    @property
    def queue_depth(self) -> int:
        return self._depth

    @property
    def closed(self) -> bool:
        return self._ring is None

    def _self_test(self) -> None:
        """Check READ/WRITE exist and one NOP makes the round trip (seccomp may block enter)."""
        ring = self._live_ring()
        if not ring.supports((u.IORING_OP_READ, u.IORING_OP_WRITE)):
            raise BackendUnavailableError(
                errno.ENOSYS, "io_uring lacks IORING_OP_READ/WRITE (Linux >= 5.6 needed)"
            )
        ring.push(u.IORING_OP_NOP, -1, 0, 0, 0, 0)
        while ring.outstanding:
            ring.enter(min_complete=1)
            for _, res in ring.reap():
                if res < 0:
                    raise BackendUnavailableError(-res, "io_uring NOP failed")

    def _live_ring(self) -> Ring:
        if self._ring is None:
            raise self._closed_error()
        return self._ring

    def run(self, ops: Sequence[IOOp]) -> None:
        ops = list(ops)
        check_ops(ops)
        failures: dict[int, IOBackendError] = {}
        with self._lock:
            ring = self._live_ring()
            self._drain(ring)  # leftovers of a run interrupted while draining
            try:
                self._pump(ring, ops, failures)
            finally:
                self._drain(ring)
        if failures:
            raise failures[min(failures)]

    def _pump(self, ring: Ring, ops: list[IOOp], failures: dict[int, IOBackendError]) -> None:
        nxt = 0
        while ring.outstanding or (nxt < len(ops) and not failures):
            while nxt < len(ops) and not failures and ring.outstanding < self._depth:
                op = ops[nxt]
                keep = ffi.from_buffer(op.buf, require_writable=not op.write)
                address = int(ffi.cast("uintptr_t", keep))
                self._push(ring, _Pending(nxt, op, keep, address))
                nxt += 1
            ring.enter(min_complete=1)
            for user_data, res in ring.reap():
                pending = self._inflight.pop(user_data)
                self._complete(ring, pending, res, failures)

    def _push(self, ring: Ring, p: _Pending) -> None:
        user_data, self._next_id = self._next_id, self._next_id + 1
        self._inflight[user_data] = p
        opcode = u.IORING_OP_WRITE if p.op.write else u.IORING_OP_READ
        remaining = min(p.op.length - p.done, _MAX_SQE_BYTES)
        ring.push(opcode, p.op.fd, p.op.offset + p.done, p.address + p.done, remaining, user_data)

    def _complete(
        self, ring: Ring, p: _Pending, res: int, failures: dict[int, IOBackendError]
    ) -> None:
        op = p.op
        if res < 0:
            failures.setdefault(p.index, IOBackendError(-res, op.path, op.offset, op.length, op.op))
        elif res == 0:
            failures.setdefault(p.index, short_transfer_error(op, p.done))
        else:
            p.done += res
            if p.done < op.length:
                self._push(ring, p)  # resume a short transfer for the remainder

    def _drain(self, ring: Ring) -> None:
        """Submit what is pushed and reap until no SQE is outstanding; drop the results."""
        while ring.outstanding:
            ring.enter(min_complete=1)
            ring.reap()
        self._inflight.clear()

    def close(self) -> None:
        with self._lock:
            ring, self._ring = self._ring, None
            if ring is None:
                return
            try:
                self._drain(ring)
            finally:
                ring.close()
