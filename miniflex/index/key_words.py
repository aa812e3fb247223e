"""Conversion between 128-bit :data:`~miniflex.types.ChunkKey` ints and numpy words.

Compiled code cannot hold a 128-bit Python int, so the index stores every key
as two unsigned 64-bit words: ``hi = key >> 64`` and ``lo = key & (2**64 - 1)``.
A batch of keys travels as a C-contiguous ``(n, 2)`` ``uint64`` array whose
row ``i`` is ``[hi, lo]`` of key ``i``.

Every function here validates its input: a key must be an integer (anything
accepted by :func:`operator.index`) with ``0 <= key < 2**128``; anything else
raises :class:`ValueError` (or :class:`TypeError` for non-integers) naming the
offending key and its position.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import repeat

import numpy as np

from miniflex.types import ChunkKey

__all__ = ["KEY_BITS", "array_to_keys", "keys_to_array", "split_key"]

KEY_BITS = 128
"""Width of a chunk key in bits."""

_WORD_MASK = (1 << 64) - 1
_KEY_LIMIT = 1 << KEY_BITS
_LITTLE_ENDIAN_U64 = np.dtype("<u8")


def _checked_key(key: object, position: int | None = None) -> int:
    """Return ``key`` as a plain int, raising a readable error if it is not a valid key."""
    where = "" if position is None else f" at position {position}"
    try:
        value = operator.index(key)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"chunk key{where} must be an integer in [0, 2**128), got {type(key).__name__} {key!r}"
        ) from None
    if not 0 <= value < _KEY_LIMIT:
        raise ValueError(f"chunk key{where} must be in [0, 2**128), got {value}")
    return value


def split_key(key: int) -> tuple[int, int]:
    """Split a 128-bit key into its ``(hi, lo)`` 64-bit words.

    Contract: ``(hi << 64) | lo == key`` and both words are in ``[0, 2**64)``.

    Raises:
        ValueError: ``key`` is negative or ``>= 2**128``.
        TypeError: ``key`` is not an integer.
    """
    value = _checked_key(key)
    return value >> 64, value & _WORD_MASK


def keys_to_array(keys: Sequence[int]) -> np.ndarray:
    """Pack ``keys`` into a new C-contiguous ``(len(keys), 2)`` ``uint64`` array.

    Row ``i`` is ``[hi, lo]`` of ``keys[i]`` (see :func:`split_key`). An empty
    sequence gives an array of shape ``(0, 2)``.

    Raises:
        ValueError: some key is negative or ``>= 2**128`` (the message gives its
            position and value).
        TypeError: some element is not an integer.
    """
    n = len(keys)
    try:
        # Fast path: one C-level to_bytes per key, no Python frame per key. It
        # rejects negative and too-large values (OverflowError) and non-ints
        # (TypeError, numpy integers included), which the slow path sorts out.
        raw = b"".join(map(int.to_bytes, keys, repeat(16, n), repeat("little", n)))
    except (OverflowError, TypeError):
        raw = b"".join([_checked_key(k, i).to_bytes(16, "little") for i, k in enumerate(keys)])
    # Each key is 16 little-endian bytes: the lo word, then the hi word.
    lo_hi = np.frombuffer(raw, dtype=_LITTLE_ENDIAN_U64, count=2 * n).reshape(n, 2)
    return np.ascontiguousarray(lo_hi[:, ::-1], dtype=np.uint64)


def array_to_keys(arr: np.ndarray) -> list[ChunkKey]:
    """Inverse of :func:`keys_to_array`: turn ``(n, 2)`` ``[hi, lo]`` rows back into keys.

    Accepts any integer array of shape ``(n, 2)`` whose values fit in ``uint64``.

    Raises:
        ValueError: ``arr`` does not have shape ``(n, 2)`` or holds values
            outside ``[0, 2**64)``.
    """
    a = np.asarray(arr)
    if a.ndim != 2 or a.shape[1] != 2:
        raise ValueError(f"key array must have shape (n, 2), got {a.shape}")
    if a.dtype != np.uint64:
        if a.dtype.kind not in "iu":
            raise ValueError(f"key array must hold integers, got dtype {a.dtype}")
        # Integer dtypes other than uint64 are at most 64 bits wide, so only
        # negative values can fall outside [0, 2**64).
        if a.dtype.kind == "i" and a.size and a.min() < 0:
            raise ValueError("key array words must be in [0, 2**64)")
        a = a.astype(np.uint64)
    return [ChunkKey((hi << 64) | lo) for hi, lo in a.tolist()]
