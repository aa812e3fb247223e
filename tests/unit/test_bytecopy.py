"""bytecopy: the copies MiniFlex's threads make of chunk bytes are exact and their own."""

from __future__ import annotations

import numpy as np

from miniflex.bytecopy import copy_into, owned_copy


def test_an_owned_copy_keeps_the_bytes_after_the_source_changes() -> None:
    src = np.arange(1 << 16, dtype=np.uint16)  # any buffer; copied as bytes
    copy = owned_copy(memoryview(src))
    src[:] = 0
    assert copy.dtype == np.uint8 and copy.nbytes == 1 << 17
    assert np.array_equal(copy.view(np.uint16), np.arange(1 << 16, dtype=np.uint16))


def test_parts_copied_in_order_fill_the_buffer_exactly() -> None:
    parts = [bytes([i]) * n for i, n in enumerate((5, 0, 4096, 7), start=1)]
    out = bytearray(4200)
    at = 0
    for part in parts:
        at = copy_into(memoryview(out), at, part)
    assert at == 4108 and bytes(out[:at]) == b"".join(parts) and not any(out[at:])
