"""One raw connection to a Redis or Valkey server, whose replies are read straight into buffers.

The fetch path's own client (``redis`` and hiredis still serve every other
call). ``redis`` reads a reply into its own buffers, builds a ``bytes`` per
field, and gives the interpreter lock up and takes it back once per socket read;
beside vLLM's engine thread each take-back waits up to the switch interval
(5 ms). Here a reply's framing lines are read through a small buffer, and its
payload, once the framing is known, goes straight to the caller's memory in one
``recvmsg_into`` with ``MSG_WAITALL`` (a scatter read of every part and the
frames between them): one system call, and one hand-off of the lock, per chunk.
Framing reads and sends first try without giving the lock up
(:mod:`miniflex.remote.held_io`): their bytes are usually there already.

Bounded time: the socket is blocking with ``SO_RCVTIMEO``/``SO_SNDTIMEO`` of
``timeout_s``, so each system call returns within it; a call that returns with
nothing is a :class:`WireTimeout`. Any other surprise (a closed connection, a
framing byte out of place) is a :class:`WireError`: the stream is no longer in
step with the requests, so the connection is closed and the caller opens a new
one. Plain TCP and Unix sockets only (``recvmsg_into`` does not exist on a TLS
socket; TLS and clusters keep the ``redis`` client). Example::

    conn = WireConnection(Endpoint(host="127.0.0.1", port=6379), timeout_s=1.0)
    conn.send(b"GET", b"k")
    line = conn.read_line()                  # b"$9437184" (no CRLF)
    conn.read_into([slot[:9437184], crlf])   # the payload, then its CRLF
"""

from __future__ import annotations

import ctypes
import errno
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from miniflex.errors import MiniFlexError
from miniflex.remote.held_io import recv_now, send_now
from miniflex.remote.resp import RespPacker

__all__ = ["Endpoint", "ReplyError", "WireConnection", "WireError", "WireTimeout"]

SCRATCH_BYTES = 64 << 10
"""The framing buffer; payload bytes read into it with a line are copied out once."""
_MAX_IOV = 512
"""Buffers per ``recvmsg_into`` (Linux allows 1,024)."""
_MAX_LINE = 4096


class WireError(MiniFlexError):
    """The connection broke or fell out of step with its requests; it must be closed."""


class WireTimeout(WireError):
    """A system call on the connection waited ``timeout_s`` and got nothing."""


class ReplyError(MiniFlexError):
    """The server answered with an error reply (``-ERR ...``); the connection is in step."""


@dataclass(frozen=True)
class Endpoint:
    """Where one server listens, and how to log in (from ``redis``'s own URL parsing)."""

    host: str = ""
    port: int = 6379
    path: str = ""
    """A Unix socket's path (then ``host`` and ``port`` are unused)."""
    db: int = 0
    username: str | None = None
    password: str | None = None

    @classmethod
    def of_pool(cls, kwargs: dict[str, object]) -> Endpoint:
        """From a ``redis.ConnectionPool``'s ``connection_kwargs``."""
        return cls(
            host=str(kwargs.get("host") or ""),
            port=int(kwargs.get("port") or 6379),  # type: ignore[call-overload]
            path=str(kwargs.get("path") or ""),
            db=int(kwargs.get("db") or 0),  # type: ignore[call-overload]
            username=kwargs.get("username"),  # type: ignore[arg-type]
            password=kwargs.get("password"),  # type: ignore[arg-type]
        )


class WireConnection:
    """A connected, logged-in socket: send commands, read replies. Not thread safe."""

    def __init__(self, endpoint: Endpoint, timeout_s: float) -> None:
        """Connects and logs in; WireError (WireTimeout) or ReplyError (refused login)."""
        self._packer = RespPacker()
        self._buf = bytearray(SCRATCH_BYTES)
        self._view = memoryview(self._buf)
        self._address = ctypes.addressof((ctypes.c_char * SCRATCH_BYTES).from_buffer(self._buf))
        self._start = self._end = 0
        self._sock = _connect(endpoint, timeout_s)
        try:
            self._login(endpoint)
        except BaseException:
            self.close()
            raise

    def _login(self, endpoint: Endpoint) -> None:
        if endpoint.password:
            user = [endpoint.username] if endpoint.username else []
            self.send("AUTH", *user, endpoint.password)
            self.expect_ok()
        if endpoint.db:
            self.send("SELECT", endpoint.db)
            self.expect_ok()

    def pack(self, *args: bytes | str | int | memoryview) -> list[bytes | bytearray | memoryview]:
        """One command as buffers (arguments as in :class:`~miniflex.remote.resp.RespPacker`)."""
        return self._packer.pack(*args)

    def send(self, *args: bytes | str | int | memoryview) -> None:
        """Send one command."""
        self.send_all(self._packer.pack(*args))

    def send_all(self, buffers: Sequence[bytes | bytearray | memoryview]) -> None:
        """Send packed commands, several at once (a pipeline) if given together."""
        data = b"".join(buffers)
        try:
            sent = send_now(self._sock.fileno(), data) or 0  # the usual case: no wait
            if sent < len(data):
                self._sock.sendall(memoryview(data)[sent:])
        except OSError as exc:
            raise _as_wire_error(exc, "send") from None

    def expect_ok(self) -> None:
        """Read a ``+OK``; ReplyError for an error reply, WireError for anything else."""
        line = self.read_line()
        if line != b"+OK":
            raise WireError(f"expected +OK, got {line[:80]!r}")

    def read_line(self) -> bytes:
        """The next line without its CRLF; an error reply raises ReplyError."""
        while True:
            at = self._buf.find(b"\r\n", self._start, self._end)
            if at >= 0:
                line = bytes(self._view[self._start : at])
                self._start = at + 2
                if line[:1] == b"-":
                    raise ReplyError(line[1:].decode("utf-8", "replace"))
                return line
            if self._end - self._start > _MAX_LINE:
                raise WireError("a reply line longer than 4 KiB: not a Redis server")
            self._fill()

    def read_into(self, buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers`` (byte views) in order with the next bytes of the stream."""
        pending = []
        for buf in buffers:
            took = min(self._end - self._start, len(buf))
            if took:
                buf[:took] = self._view[self._start : self._start + took]
                self._start += took
            if took < len(buf):
                pending.append(buf[took:])
        while pending:
            batch = pending[:_MAX_IOV]
            got = self._recv(batch)
            pending = _advance(batch, got) + pending[_MAX_IOV:]

    def close(self) -> None:
        """Close the socket; idempotent."""
        self._sock.close()

    def _fill(self) -> None:
        """Read what has arrived (at least one byte) into the scratch buffer."""
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._buf):
            rest = self._end - self._start
            self._buf[:rest] = self._view[self._start : self._end]
            self._start, self._end = 0, rest
        try:
            got = recv_now(
                self._sock.fileno(), self._address + self._end, len(self._buf) - self._end
            )
        except OSError as exc:
            raise _as_wire_error(exc, "receive") from None
        if got == 0:
            raise WireError("the server closed the connection")
        if got is None:  # nothing there yet: wait for it, giving the lock up
            got = self._recv([self._view[self._end :]], wait_all=False)
        self._end += got

    def _recv(self, buffers: list[memoryview], wait_all: bool = True) -> int:
        flags = socket.MSG_WAITALL if wait_all else 0
        try:
            got = self._sock.recvmsg_into(buffers, 0, flags)[0]
        except OSError as exc:
            raise _as_wire_error(exc, "receive") from None
        if got == 0:
            raise WireError("the server closed the connection")
        return got


def _advance(buffers: list[memoryview], got: int) -> list[memoryview]:
    """What remains of ``buffers`` once ``got`` bytes have filled them in order."""
    out = []
    for buf in buffers:
        if got >= len(buf):
            got -= len(buf)
            continue
        out.append(buf[got:])
        got = 0
    return out


def _connect(endpoint: Endpoint, timeout_s: float) -> socket.socket:
    family = socket.AF_UNIX if endpoint.path else socket.AF_INET
    address: object = endpoint.path or (endpoint.host, endpoint.port)
    if not endpoint.path:
        try:
            family, _, _, _, address = socket.getaddrinfo(
                endpoint.host, endpoint.port, type=socket.SOCK_STREAM
            )[0]
        except OSError as exc:
            raise WireError(f"cannot resolve {endpoint.host}: {exc}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.connect(address)
        sock.settimeout(None)  # blocking: the kernel bounds each call, one call per read
        limit = struct.pack("ll", int(timeout_s), int(timeout_s % 1 * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as exc:
        sock.close()
        raise _as_wire_error(exc, "connect") from None
    return sock


def _as_wire_error(exc: OSError, what: str) -> WireError:
    if isinstance(exc, TimeoutError) or exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
        return WireTimeout(f"{what} timed out")
    return WireError(f"{what} failed: {exc}")
