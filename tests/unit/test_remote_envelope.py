"""The remote envelope: a header binds bytes to their namespace, key and checksum."""

from __future__ import annotations

import pytest

from miniflex.remote.envelope import (
    HEADER_BYTES,
    CorruptValueError,
    open_envelope,
    pack_header,
    split,
)
from miniflex.types import ChunkKey

NS = bytes(range(16))
KEY = ChunkKey(2**127 + 12345)
DATA = bytes(range(256)) * 41  # 10496 bytes: not a multiple of the part size


def _sealed(data: bytes = DATA, part: int = 4096) -> tuple[bytes, list[bytes]]:
    parts = [bytes(p) for p in split(memoryview(data), part)]
    return pack_header(NS, KEY, memoryview(data), len(parts)), parts


def test_split_covers_the_bytes_in_order() -> None:
    parts = split(memoryview(DATA), 4096)
    assert [len(p) for p in parts] == [4096, 4096, 2304]
    assert b"".join(parts) == DATA
    assert split(memoryview(b""), 4096) == []


def test_a_sealed_value_opens_to_the_same_bytes() -> None:
    header, parts = _sealed()
    assert len(header) == HEADER_BYTES
    assert open_envelope(header, parts, NS, KEY) == DATA
    empty_header, none = _sealed(b"")
    assert open_envelope(empty_header, none, NS, KEY) == b""


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda h, p: (h, [p[0], p[1][:-1] + b"\0", p[2]]), "checksum"),
        (lambda h, p: (h, p[:2]), "2 parts"),
        (lambda h, p: (h, [p[0], p[1] + b"x", p[2]]), "bytes, the header says"),
        (lambda h, p: (None, p), "no MiniFlex header"),
        (lambda h, p: (b"XXXX" + h[4:], p), "not a MiniFlex envelope"),
        (lambda h, p: (h[:4] + b"\x03\0" + h[6:], p), "not a MiniFlex envelope of version 2"),
        (lambda h, p: (h[:6] + b"\x63\0" + h[8:], p), "format version 99"),
        (lambda h, p: (h[:8] + bytes(16) + h[24:], p), "another namespace"),
    ],
)
def test_any_change_is_refused_with_its_reason(change: object, says: str) -> None:
    header, parts = change(*_sealed())  # type: ignore[operator]
    with pytest.raises(CorruptValueError, match=says):
        open_envelope(header, parts, NS, KEY)


def test_the_same_bytes_under_another_key_or_namespace_are_refused() -> None:
    header, parts = _sealed()
    with pytest.raises(CorruptValueError, match="another namespace or chunk key"):
        open_envelope(header, parts, NS, ChunkKey(KEY + 1))
    with pytest.raises(CorruptValueError, match="another namespace or chunk key"):
        open_envelope(header, parts, bytes(16), KEY)


def test_puts_write_version_2_with_a_crc32c() -> None:
    """The checksum field is the payload's CRC32C (not zlib's CRC32, version 1's)."""
    import struct
    import zlib

    import crc32c

    header, _ = _sealed()
    version, checksum = (
        struct.unpack_from("<H", header, 4)[0],
        struct.unpack_from("<I", header, 48)[0],
    )
    assert version == 2 and checksum == crc32c.crc32c(DATA) != zlib.crc32(DATA)
