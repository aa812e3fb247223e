"""Socket calls that keep the interpreter lock: they never wait, and say when they would."""

from __future__ import annotations

import ctypes
import errno
import socket

import pytest

from miniflex.remote.held_io import recv_now, send_now


def test_recv_now_reads_what_is_there_and_says_none_when_nothing_is() -> None:
    a, b = socket.socketpair()
    buf = bytearray(16)
    address = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    try:
        assert recv_now(b.fileno(), address, len(buf)) is None  # nothing sent: no wait
        assert send_now(a.fileno(), b"hello") == 5
        assert recv_now(b.fileno(), address, len(buf)) == 5 and buf[:5] == b"hello"
        a.close()
        assert recv_now(b.fileno(), address, len(buf)) == 0  # the peer closed
    finally:
        a.close()
        b.close()


def test_send_now_says_none_when_the_buffer_is_full() -> None:
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    try:
        sent = 0
        while (n := send_now(a.fileno(), b"x" * 65536)) is not None:
            sent += n
        assert sent > 0  # it filled the buffer, then refused to wait
        b.close()
        with pytest.raises(OSError) as err:  # a closed peer is an error, not a wait, no SIGPIPE
            send_now(a.fileno(), b"x")
        assert err.value.errno in (errno.EPIPE, errno.ECONNRESET)
    finally:
        a.close()
        b.close()
