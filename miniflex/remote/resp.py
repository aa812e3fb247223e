"""Commands in the Redis protocol (RESP) as a list of buffers, large values never copied.

The ``redis`` client packs commands with hiredis when hiredis is installed,
and hiredis copies every value into one new string, which for a chunk's put
takes longer than the socket's own sending. Given as the client's
``command_packer``, :class:`RespPacker` keeps each large value (a part of a
chunk) as the buffer it is, so the socket sends straight from the caller's
memory; hiredis still parses the replies, which it does fast. Output is
byte-identical to RESP's array of bulk strings::

    RespPacker().pack("HSET", "k", b"f", memoryview(big))
    # [b"*4\\r\\n$4\\r\\nHSET\\r\\n$1\\r\\nk\\r\\n$1\\r\\nf\\r\\n$9437184\\r\\n",
    #  <memory of big>, b"\\r\\n"]
"""

from __future__ import annotations

__all__ = ["RespPacker"]

_INLINE_MAX = 16 << 10
"""Values up to this size are copied into the command's header buffer; larger are not."""

Arg = bytes | bytearray | memoryview | str | int | float


def _encode(arg: Arg) -> bytes | bytearray | memoryview:
    if isinstance(arg, (bytes, bytearray, memoryview)):
        return arg
    if isinstance(arg, bool):
        raise TypeError("a bool is not a Redis argument")
    if isinstance(arg, (int, float)):
        return repr(arg).encode()
    if isinstance(arg, str):
        return arg.encode()
    raise TypeError(f"a {type(arg).__name__} is not a Redis argument")


class RespPacker:
    """The ``command_packer`` of a ``redis`` connection (its ``pack(*args)`` method)."""

    def pack(self, *args: Arg) -> list[bytes | bytearray | memoryview]:
        """One command as buffers to send in order; ``args[0]`` may hold several words."""
        name = args[0]
        words = (
            name.encode() if isinstance(name, str) else bytes(name)
        ).split()  # "CLIENT SETINFO"
        values = [*words, *map(_encode, args[1:])]
        out: list[bytes | bytearray | memoryview] = []
        head = bytearray(b"*%d\r\n" % len(values))
        for value in values:
            n = len(value) if not isinstance(value, memoryview) else value.nbytes
            head += b"$%d\r\n" % n
            if n <= _INLINE_MAX:
                head += value
                head += b"\r\n"
                continue
            out.append(bytes(head))
            out.append(value)
            head = bytearray(b"\r\n")
        out.append(bytes(head))
        return out
