"""Make every large allocation of a benchmark's process fresh memory.

glibc maps a large allocation anew, but once such a buffer is freed it raises its mapping
threshold and keeps later buffers of that size in the heap, whose pages were touched
before: a benchmark that frees its buffers between passes would then measure fresh
memory only in its first pass. Set once, at a benchmark's start (``__main__``), never in
a library or test process.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["fresh_buffers"]

M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter: allocations from this size on are mapped anew (and, once
set, the threshold no longer grows as buffers are freed)."""


def fresh_buffers(threshold: int = 1 << 20) -> bool:
    """Map every allocation of ``threshold`` bytes or more anew, and unmap it when freed;
    False where the C library has no ``mallopt`` (not glibc)."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return bool(
        libc is not None and hasattr(libc, "mallopt") and libc.mallopt(M_MMAP_THRESHOLD, threshold)
    )
