"""RESP packing for the redis client: exact protocol bytes, large values sent uncopied."""

from __future__ import annotations

import pytest

from miniflex.remote.resp import RespPacker


def _wire(*args: object) -> bytes:
    return b"".join(bytes(b) for b in RespPacker().pack(*args))  # type: ignore[arg-type]


def test_small_commands_are_one_buffer_of_exact_resp() -> None:
    assert RespPacker().pack("PING") == [b"*1\r\n$4\r\nPING\r\n"]
    assert _wire("SELECT", 3) == b"*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n"
    assert _wire("SET", "k", 1.5) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\n1.5\r\n"


def test_a_command_name_of_several_words_is_split() -> None:
    expected = b"*3\r\n$6\r\nCLIENT\r\n$7\r\nSETINFO\r\n$1\r\nx\r\n"
    assert _wire("CLIENT SETINFO", "x") == expected == _wire(b"CLIENT SETINFO", "x")


def test_a_large_value_is_passed_through_not_copied() -> None:
    big = memoryview(bytes(1 << 20))
    out = RespPacker().pack("HSET", "k", b"0", big, b"1", b"tail")
    assert any(piece is big for piece in out)
    assert b"".join(bytes(p) for p in out) == (
        b"*6\r\n$4\r\nHSET\r\n$1\r\nk\r\n$1\r\n0\r\n$1048576\r\n"
        + bytes(big)
        + b"\r\n$1\r\n1\r\n$4\r\ntail\r\n"
    )


def test_values_that_are_not_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="bool"):
        RespPacker().pack("SET", "k", True)
    with pytest.raises(TypeError, match="list"):
        RespPacker().pack("SET", "k", [1])
