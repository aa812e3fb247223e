"""The envelope of a chunk in the remote store: a header, and the bytes in parts.

A chunk is stored as one value of ``parts + 1`` fields: the header and the
payload cut into parts of at most ``part_bytes``. Parts keep each of the
server's buffers small: redis-benchmark moves the same bytes much faster in
values of the part size than in values of a chunk's size (docs/benchmarks.md,
"Components", "remote store vs redis-benchmark"), and a chunk reads faster in
parts than in one piece (docs/design/remote-store.md, "A stored chunk").

Header, 64 bytes, little endian::

    magic "MFXR" | envelope version u16 | MiniFlex format version u16
    | namespace digest 16B | chunk key 16B | payload length u64 | checksum u32
    | parts u32 | 8 reserved (zero)

The checksum is CRC32C (Castagnoli, the ``crc32c`` library, which uses the CPU's
CRC instruction and so runs several times faster than ``zlib.crc32``) in
envelope version 2, which every put writes; values of version 1 (``zlib.crc32``)
are still read, so a store written by an older MiniFlex keeps serving.

Example::

    parts = split(data, part_bytes)
    raw = pack_header(ns.digest, key, data, len(parts))
    header = read_header(raw, ns.digest, key)   # or CorruptValueError
    verify(header, parts, out=slot)             # copied into slot, checksum checked
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from miniflex.bytecopy import copy_into
from miniflex.errors import MiniFlexError
from miniflex.keys import FORMAT_VERSION
from miniflex.types import ChunkKey

__all__ = [
    "ENVELOPE_VERSION",
    "HEADER_BYTES",
    "CorruptValueError",
    "Header",
    "checksum",
    "open_envelope",
    "pack_header",
    "read_header",
    "split",
    "verify",
]

ENVELOPE_VERSION = 2
"""The version puts write (CRC32C); version 1 (zlib's CRC32) is read too."""
_READABLE = (1, 2)
_MAGIC = b"MFXR"
_HEADER = struct.Struct("<4sHH16s16sQII8x")
HEADER_BYTES = _HEADER.size
assert HEADER_BYTES == 64


class CorruptValueError(MiniFlexError):
    """A stored value is not this chunk's verified bytes; the message says what differs."""


def split(data: memoryview, part_bytes: int) -> list[memoryview]:
    """``data`` in consecutive parts of ``part_bytes`` (the last may be shorter; none if empty)."""
    assert part_bytes > 0, part_bytes
    return [data[at : at + part_bytes] for at in range(0, len(data), part_bytes)]


def pack_header(namespace_digest: bytes, key: ChunkKey, data: memoryview, parts: int) -> bytes:
    """The header of ``data`` (a byte view) stored under ``key`` in ``parts`` parts."""
    return _HEADER.pack(
        _MAGIC,
        ENVELOPE_VERSION,
        FORMAT_VERSION,
        namespace_digest,
        key.to_bytes(16, "little"),
        len(data),
        crc32c.crc32c(data),
        parts,
    )


def checksum(version: int, data: memoryview, value: int = 0, hold_lock: bool = False) -> int:
    """``data``'s checksum in envelope ``version``, continued from ``value``.

    ``hold_lock``: compute it without giving the interpreter lock up (CRC32C only). With the
    CPU's CRC instruction a chunk's checksum is shorter than the wait to take the lock back
    beside a thread running Python (up to the switch interval, 5 ms), so a fetch thread
    keeps it.
    """
    if version == 1:
        return zlib.crc32(data, value)
    return crc32c.crc32c(data, value, gil_release_mode=0 if hold_lock else -1)


@dataclass(frozen=True)
class Header:
    """What a verified header promises about the parts that follow it."""

    length: int
    crc32: int
    """The checksum (CRC32 in version 1, CRC32C in version 2)."""
    parts: int
    version: int = ENVELOPE_VERSION


def read_header(raw: bytes | None, namespace_digest: bytes, key: ChunkKey) -> Header:
    """The header of ``key``'s value in this namespace; CorruptValueError for any other."""
    if raw is None or len(raw) != HEADER_BYTES:
        raise CorruptValueError("no MiniFlex header")
    magic, version, fmt, digest, raw_key, length, crc, count = _HEADER.unpack(raw)
    if magic != _MAGIC or version not in _READABLE:
        raise CorruptValueError(f"not a MiniFlex envelope of version {ENVELOPE_VERSION} or older")
    if fmt != FORMAT_VERSION:
        raise CorruptValueError(f"format version {fmt}, this MiniFlex reads {FORMAT_VERSION}")
    if digest != namespace_digest or raw_key != key.to_bytes(16, "little"):
        raise CorruptValueError("written for another namespace or chunk key")
    return Header(length, crc, count, version)


def verify(header: Header, parts: Sequence[bytes], out: memoryview | None = None) -> None:
    """Check ``parts`` against ``header``, copying them into ``out`` (a byte view) if given.

    Raises CorruptValueError for a wrong part count, length or checksum (``out``
    then holds unspecified bytes), or a payload longer than ``out``.
    """
    if header.parts != len(parts):
        raise CorruptValueError(f"{len(parts)} parts, the header says {header.parts}")
    total = sum(len(p) for p in parts)
    if total != header.length:
        raise CorruptValueError(f"{total} bytes, the header says {header.length}")
    if out is not None and total > len(out):
        raise CorruptValueError(f"{total} bytes, more than the {len(out)}-byte buffer")
    if out is None:
        crc = 0
        for part in parts:
            crc = checksum(header.version, memoryview(part), crc)
    else:
        at = 0
        for part in parts:
            at = copy_into(out, at, part)
        # once over the copy: one handoff of the lock, not one a part. The slot must not be
        # written meanwhile (the worker's SlotGuard): a changed byte would fail the check,
        # and a value failing it is deleted from the store
        crc = checksum(header.version, out[:total])
    if crc != header.crc32:
        raise CorruptValueError("checksum mismatch")


def open_envelope(
    raw_header: bytes | None, parts: Sequence[bytes], namespace_digest: bytes, key: ChunkKey
) -> bytes:
    """The payload that ``raw_header`` and ``parts`` hold, verified; CorruptValueError otherwise."""
    verify(read_header(raw_header, namespace_digest, key), parts)
    return b"".join(parts)
