"""Copies of large buffers that let other threads run meanwhile.

A copy made by ``bytes(view)``, ``b"".join(...)`` or ``view[a:b] = part`` holds
the interpreter lock for the whole memcpy. A MiniFlex thread that makes such
copies chunk after chunk (9 MiB each for an 8B model) makes vLLM's engine
thread wait at each handoff of the lock, up to the switch interval (5 ms) every
time: an engine step hands the lock over many times. numpy releases the lock
for a plain copy, so these helpers copy through it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["copy_into", "owned_copy"]


def _bytes_of(buf: object) -> np.ndarray:
    return np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)  # type: ignore[arg-type]


def owned_copy(src: object) -> np.ndarray:
    """A copy of the bytes of buffer ``src`` (a 1-D uint8 array) that owns its memory."""
    data = _bytes_of(src)
    out = np.empty_like(data)
    np.copyto(out, data)
    return out


def copy_into(dst: memoryview | bytearray | np.ndarray, at: int, src: object) -> int:
    """Copy the bytes of ``src`` into ``dst`` from byte ``at`` on; returns the byte after."""
    data = _bytes_of(src)
    end = at + data.size
    np.copyto(_bytes_of(dst)[at:end], data)
    return end
