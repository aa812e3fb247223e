"""Socket calls that keep the interpreter lock: for bytes that have already arrived.

Python's socket methods give the interpreter lock up around every system call.
Beside a thread that runs Python without a pause (vLLM's engine loop while a
request waits for its KV), taking it back waits up to the switch interval,
5 ms, however short the call was. A fetch's small reads (the header replies
that follow a window's payload) and small sends (the next requests) usually
find their bytes there or their buffer free: these non-blocking calls, made
through ``ctypes.PyDLL`` (which keeps the lock), cost microseconds then. Where
they would block, they answer None and the caller makes the blocking call.
Linux and glibc (or musl): ``recv`` and ``send`` from the C library the
interpreter runs on. Example::

    n = recv_now(sock.fileno(), address, 65536)   # None: nothing yet, block instead
    sent = send_now(sock.fileno(), request)        # None: buffer full, sendall instead
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import socket

__all__ = ["recv_now", "send_now"]

_AGAIN = (errno.EAGAIN, errno.EWOULDBLOCK)


@functools.cache
def _libc() -> ctypes.PyDLL:
    libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: calls keep the interpreter lock
    for name in ("recv", "send"):
        fn = getattr(libc, name)
        fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        fn.restype = ctypes.c_ssize_t
    return libc


def recv_now(fd: int, address: int, nbytes: int) -> int | None:
    """Bytes read into ``address`` without waiting (0: the peer closed); None if none have
    arrived. OSError for a failed call."""
    got = _libc().recv(fd, address, nbytes, socket.MSG_DONTWAIT)
    return _result(got)


def send_now(fd: int, data: bytes) -> int | None:
    """Bytes of ``data`` sent without waiting; None if the socket's buffer is full. OSError
    for a failed call."""
    sent = _libc().send(fd, data, len(data), socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
    return _result(sent)


def _result(n: int) -> int | None:
    if n >= 0:
        return n
    code = ctypes.get_errno()
    if code in _AGAIN:
        return None
    if code == errno.EINTR:
        return None  # the blocking call retries
    raise OSError(code, os.strerror(code))
