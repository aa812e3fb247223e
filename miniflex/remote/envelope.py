"""The envelope of a chunk in the remote store: a header, and the bytes in parts.

A chunk is stored as one value of ``parts + 1`` fields: the header and the
payload cut into parts of at most ``part_bytes``. Parts keep each of the
store's allocations below the size where Redis's allocator stops caching
memory (8 MiB in jemalloc), which costs large values a page fault per 4 KiB
on every write and read (docs/design.md, "Remote tier").

Header, 64 bytes, little endian::

    magic "MFXR" | envelope version u16 | MiniFlex format version u16
    | namespace digest 16B | chunk key 16B | payload length u64 | CRC32 u32
    | parts u32 | 8 reserved (zero)

Example::

    head = pack_header(ns.digest, key, data, len(split(data, part_bytes)))
    data2 = open_envelope(head, parts, ns.digest, key)   # or CorruptValueError
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

from miniflex.errors import MiniFlexError
from miniflex.keys import FORMAT_VERSION
from miniflex.types import ChunkKey

__all__ = [
    "ENVELOPE_VERSION",
    "HEADER_BYTES",
    "CorruptValueError",
    "open_envelope",
    "pack_header",
    "split",
]

ENVELOPE_VERSION = 1
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
        zlib.crc32(data),
        parts,
    )


def open_envelope(
    header: bytes | None, parts: Sequence[bytes], namespace_digest: bytes, key: ChunkKey
) -> bytes:
    """The payload that ``header`` and ``parts`` hold, verified; CorruptValueError otherwise."""
    if header is None or len(header) != HEADER_BYTES:
        raise CorruptValueError("no MiniFlex header")
    magic, version, fmt, digest, raw_key, length, crc, count = _HEADER.unpack(header)
    if magic != _MAGIC or version != ENVELOPE_VERSION:
        raise CorruptValueError(f"not a MiniFlex envelope of version {ENVELOPE_VERSION}")
    if fmt != FORMAT_VERSION:
        raise CorruptValueError(f"format version {fmt}, this MiniFlex reads {FORMAT_VERSION}")
    if digest != namespace_digest or raw_key != key.to_bytes(16, "little"):
        raise CorruptValueError("written for another namespace or chunk key")
    if count != len(parts):
        raise CorruptValueError(f"{len(parts)} parts, the header says {count}")
    data = b"".join(parts)
    if len(data) != length:
        raise CorruptValueError(f"{len(data)} bytes, the header says {length}")
    if zlib.crc32(data) != crc:
        raise CorruptValueError("checksum mismatch")
    return data
