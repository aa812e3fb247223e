"""Chunks' ``HMGET`` replies, read off a :class:`~miniflex.remote.wire.WireConnection` into slots.

A chunk is a hash of the header field ``h`` and payload fields ``0`` ..
``parts-1`` (:mod:`miniflex.remote.redis_store`). A window of chunks is read in
two requests per chunk:

1. for each, ``HMGET name h``, ``HLEN name`` and ``HSTRLEN name i`` of every
   part the slot can hold: small replies, read through the connection's line
   buffer; the header is verified, and the hash must hold exactly its parts, each
   of the size the header implies (:func:`read_header_reply`);
2. ``HMGET name 0 .. parts-1`` for each verified header: the reply is then known
   to the byte (every part but the last is ``part_bytes`` long), so the whole
   window's parts are read in one scatter read (:class:`PartsPlan`), straight
   into the destination slots, with the frames between them into small buffers
   that are then compared with what they must be.

One system call for a window's payload is what keeps a fetch fast beside
vLLM's engine thread: each call gives the interpreter lock up, and taking it
back can wait 5 ms. The first step makes the second safe: a damaged value
(a part missing, cut short or added) is found there, and dropped, with the
connection in step. Only a value changed between the two steps by another
client (the server may run its commands in between) can make the second
reply differ from the plan: :class:`OutOfStep` where its frames differ (the
connection is closed, the window's chunks from there on are misses), or, if
it is shorter and nothing follows it, a read that times out.
Example::

    conn.send_all([p for words in header_request(name, len(slot), part_bytes)
                   for p in conn.pack(*words)])
    header = read_header_reply(conn, digest, key, len(slot), part_bytes)  # None: a miss
    plan = PartsPlan(); plan.add(slot, header, part_bytes)
    conn.send_all(conn.pack(*parts_request(name, header.parts)) + ...)
    plan.read(conn)                       # then plan.verified(i) per chunk
"""

from __future__ import annotations

from miniflex.remote.envelope import (
    HEADER_BYTES,
    CorruptValueError,
    Header,
    checksum,
    read_header,
)
from miniflex.remote.wire import ReplyError, WireConnection, WireError
from miniflex.types import ChunkKey

__all__ = [
    "HEADER_FIELD",
    "OutOfStep",
    "PartsPlan",
    "header_request",
    "parts_request",
    "read_header_reply",
]

HEADER_FIELD = b"h"
_CRLF = b"\r\n"
_NIL = b"$-1"
_SKIP_BYTES = 1 << 20


class OutOfStep(CorruptValueError):
    """A reply whose framing is not what the header promised: close the connection."""


def header_request(name: str, capacity: int, part_bytes: int) -> list[list[bytes]]:
    """The commands asking for the header and the shape of the value named ``name``."""
    key = name.encode()
    fields = -(-capacity // part_bytes)
    return [
        [b"HMGET", key, HEADER_FIELD],
        [b"HLEN", key],
        *([b"HSTRLEN", key, b"%d" % i] for i in range(fields)),
    ]


def parts_request(name: str, parts: int) -> list[bytes]:
    """The words fetching the ``parts`` payload fields of the value named ``name``."""
    return [b"HMGET", name.encode(), *(b"%d" % i for i in range(parts))]


def read_header_reply(
    conn: WireConnection, digest: bytes, key: ChunkKey, capacity: int, part_bytes: int
) -> Header | None:
    """The verified header of :func:`header_request`'s replies; None if the key is absent.

    CorruptValueError (the connection in step) for a value that is not this
    chunk's, a WRONGTYPE error reply, a value longer than ``capacity``, or a
    hash whose fields are not the header and its parts in ``part_bytes``; other
    error replies raise ReplyError (the connection in step).
    """
    fields = -(-capacity // part_bytes)
    replies = [_read_array_of_one(conn), *(_read_int(conn) for _ in range(fields + 1))]
    for reply in replies:  # every reply is read first, so the connection stays in step
        if isinstance(reply, BaseException):
            raise reply
    raw, stored, sizes = replies[0], replies[1], replies[2:]
    if raw is None and stored == 0:
        return None
    header = read_header(raw, digest, key)  # type: ignore[arg-type]
    if header.length == 0 or header.length > capacity:
        raise CorruptValueError(f"{header.length} bytes for a {capacity}-byte buffer")
    expected = [min(part_bytes, header.length - at) for at in range(0, header.length, part_bytes)]
    if header.parts != len(expected) or stored != len(expected) + 1:
        raise CorruptValueError(f"{stored} fields, the header says {header.parts} parts")
    if sizes[: len(expected)] != expected:
        raise CorruptValueError(f"parts of {sizes[: len(expected)]} bytes, not {expected}")
    return header


class PartsPlan:
    """The expected replies of a window's :func:`parts_request` calls, read in one go."""

    def __init__(self) -> None:
        self._buffers: list[memoryview] = []
        self._chunks: list[tuple[memoryview, Header, list[memoryview], bytes]] = []

    def add(self, out: memoryview, header: Header, part_bytes: int) -> None:
        """Expect the parts of ``header``'s value, read into the start of ``out``."""
        expected = bytearray(b"*%d\r\n" % header.parts)
        first = memoryview(bytearray(len(expected)))
        frames, buffers = [first], [first]
        for at in range(0, header.length, part_bytes):
            size = min(part_bytes, header.length - at)
            frame = b"$%d\r\n" % size
            expected += frame + _CRLF
            head, crlf = memoryview(bytearray(len(frame))), memoryview(bytearray(2))
            frames += [head, crlf]
            buffers += [head, out[at : at + size], crlf]
        self._buffers += buffers
        self._chunks.append((out, header, frames, bytes(expected)))

    def read(self, conn: WireConnection) -> None:
        """Read every expected reply (WireError if the connection fails)."""
        conn.read_into(self._buffers)

    def verified(self, i: int) -> int:
        """The length of the ``i``-th chunk added, once its frames and checksum are checked.

        OutOfStep if its frames are not those expected (this and every later
        chunk of the window are then unread), CorruptValueError for a checksum
        that does not match.
        """
        out, header, frames, expected = self._chunks[i]
        if b"".join(frames) != expected:
            raise OutOfStep("the value's fields are not the sizes its header promises")
        if checksum(header.version, out[: header.length], hold_lock=True) != header.crc32:
            raise CorruptValueError("checksum mismatch")
        return header.length


def _read_array_of_one(conn: WireConnection) -> bytes | BaseException | None:
    """The bulk string in a one-element array (see :func:`_read_bulk`), or the error it was."""
    line = _reply_line(conn)
    if isinstance(line, BaseException):
        return line
    if line != b"*1":
        raise WireError(f"expected an array of 1, got {line[:80]!r}")
    return _read_bulk(conn)


def _read_int(conn: WireConnection) -> int | BaseException:
    """An integer reply, or the error it was."""
    line = _reply_line(conn)
    if isinstance(line, BaseException):
        return line
    if line[:1] != b":" or not line[1:].isdigit():
        raise WireError(f"expected an integer, got {line[:80]!r}")
    return int(line[1:])


def _reply_line(conn: WireConnection) -> bytes | BaseException:
    """The next line, or the error reply it was (WRONGTYPE: a CorruptValueError)."""
    try:
        return conn.read_line()
    except ReplyError as exc:
        if str(exc).startswith("WRONGTYPE"):
            return CorruptValueError("not a MiniFlex hash (WRONGTYPE)")
        return exc


def _read_bulk(conn: WireConnection) -> bytes | None:
    """One bulk string: None for nil, the bytes of a header-sized one, else b"" (skipped)."""
    line = conn.read_line()
    if line == _NIL:
        return None
    if line[:1] != b"$" or not line[1:].isdigit():
        raise WireError(f"expected a bulk string, got {line[:80]!r}")
    size = left = int(line[1:])
    kept = b""
    while left:
        body = memoryview(bytearray(min(left, _SKIP_BYTES)))
        conn.read_into([body])
        left -= len(body)
        kept = bytes(body) if size == HEADER_BYTES else b""
    crlf = memoryview(bytearray(2))
    conn.read_into([crlf])
    if crlf != _CRLF:
        raise WireError("a bulk string without its CRLF")
    return kept
