"""Numba-compiled kernels of the open-addressing hash table behind :class:`HashIndex`.

The table is five parallel numpy arrays of the same power-of-two capacity::

    hi:    uint64[cap]   high 64 bits of the key stored in a bucket
    lo:    uint64[cap]   low 64 bits
    state: uint8[cap]    EMPTY, FULL or TOMBSTONE
    tier:  int8[cap]     Tier value of a FULL bucket
    slot:  int64[cap]    SlotId of a FULL bucket

Buckets are probed linearly from ``mix(hi ^ lo) & (cap - 1)``. A probe stops at
the first EMPTY bucket, so callers must keep at least one EMPTY bucket (the
Python wrapper keeps ``FULL + TOMBSTONE <= 0.7 * cap``). Deleting turns a bucket
into a TOMBSTONE, which lookups skip and inserts reuse.

These functions trust their arguments (dtypes, shapes, power-of-two capacity)
and use ``-1`` as "not found"; only :mod:`miniflex.index.hashindex` calls them.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = [
    "EMPTY",
    "FULL",
    "INSERTED_EMPTY",
    "INSERTED_TOMBSTONE",
    "REFUSED",
    "TOMBSTONE",
    "UPDATED",
    "contains_many",
    "delete",
    "find",
    "insert",
    "lookup",
    "lookup_many",
    "mix64",
    "prefix_match",
    "rehash_into",
]

EMPTY = np.uint8(0)
FULL = np.uint8(1)
TOMBSTONE = np.uint8(2)

# Result codes of :func:`insert`.
UPDATED = 0
INSERTED_EMPTY = 1
INSERTED_TOMBSTONE = 2
REFUSED = 3

# splitmix64 finalizer constants. All arithmetic below stays in uint64: mixing
# a uint64 with a plain Python int in numba would promote to float64.
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)

# Single-key kernels take the two words of the key as int64 holding the bit
# pattern of the uint64 word (callers map w >= 2**63 to w - 2**64) and cast them
# back with np.uint64(), a no-op bit cast. Passing Python ints straight through
# would not work: numba types them as int64 or uint64 depending on the value,
# its fast dispatch path then fails on uint64-sized values, and comparing a
# uint64 with an int64 inside a kernel goes through float64 and loses bits.


@numba.njit(cache=True, inline="always")
def mix64(z: np.uint64) -> np.uint64:
    """splitmix64 finalizer: a bijective 64-bit mix with good avalanche."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@numba.njit(cache=True, inline="always")
def _home(khi: np.uint64, klo: np.uint64, mask: np.int64) -> np.int64:
    """First bucket probed for key ``(khi, klo)``."""
    return np.int64(mix64(khi ^ klo) & np.uint64(mask))


@numba.njit(cache=True)
def _find(
    hi: np.ndarray, lo: np.ndarray, state: np.ndarray, khi: np.uint64, klo: np.uint64
) -> np.int64:
    """Bucket index holding key ``(khi, klo)`` (both uint64), or -1 if it is absent."""
    mask = np.int64(state.shape[0] - 1)
    i = _home(khi, klo, mask)
    while True:
        s = state[i]
        if s == EMPTY:
            return np.int64(-1)
        if s == FULL and hi[i] == khi and lo[i] == klo:
            return i
        i = (i + 1) & mask


@numba.njit(cache=True)
def find(hi: np.ndarray, lo: np.ndarray, state: np.ndarray, khi: int, klo: int) -> np.int64:
    """Bucket index holding key ``(khi, klo)`` (int64 bit patterns), or -1 if it is absent."""
    return _find(hi, lo, state, np.uint64(khi), np.uint64(klo))


@numba.njit(cache=True)
def lookup(
    hi: np.ndarray,
    lo: np.ndarray,
    state: np.ndarray,
    tier: np.ndarray,
    slot: np.ndarray,
    khi: int,
    klo: int,
) -> tuple[np.int64, np.int64]:
    """``(tier, slot)`` of key ``(khi, klo)``, or ``(-1, -1)`` if it is absent."""
    i = _find(hi, lo, state, np.uint64(khi), np.uint64(klo))
    if i < 0:
        return np.int64(-1), np.int64(-1)
    return np.int64(tier[i]), slot[i]


@numba.njit(cache=True)
def insert(
    hi: np.ndarray,
    lo: np.ndarray,
    state: np.ndarray,
    tier: np.ndarray,
    slot: np.ndarray,
    khi: int,
    klo: int,
    t: np.int64,
    s: np.int64,
    allow_new: bool,
) -> np.int64:
    """Upsert key ``(khi, klo) -> (t, s)``.

    Returns UPDATED if the key was present, INSERTED_EMPTY / INSERTED_TOMBSTONE
    if it was added (saying which kind of bucket it took), or REFUSED, leaving
    the table untouched, if it is new and ``allow_new`` is false.
    """
    uhi = np.uint64(khi)
    ulo = np.uint64(klo)
    mask = np.int64(state.shape[0] - 1)
    i = _home(uhi, ulo, mask)
    first_tomb = np.int64(-1)
    while True:
        st = state[i]
        if st == EMPTY:
            break
        if st == FULL:
            if hi[i] == uhi and lo[i] == ulo:
                tier[i] = t
                slot[i] = s
                return np.int64(UPDATED)
        elif first_tomb < 0:
            first_tomb = i
        i = (i + 1) & mask
    if not allow_new:
        return np.int64(REFUSED)
    code = np.int64(INSERTED_EMPTY)
    if first_tomb >= 0:
        i = first_tomb
        code = np.int64(INSERTED_TOMBSTONE)
    hi[i] = uhi
    lo[i] = ulo
    tier[i] = t
    slot[i] = s
    state[i] = FULL
    return code


@numba.njit(cache=True)
def delete(
    hi: np.ndarray, lo: np.ndarray, state: np.ndarray, khi: int, klo: int
) -> tuple[bool, np.int64]:
    """Remove key ``(khi, klo)``; returns ``(was_present, change_in_tombstone_count)``.

    The bucket becomes a TOMBSTONE, unless the next bucket is EMPTY: then no
    probe sequence passes through it, so it and the run of tombstones right
    before it become EMPTY (the change is then zero or negative).
    """
    i = _find(hi, lo, state, np.uint64(khi), np.uint64(klo))
    if i < 0:
        return False, np.int64(0)
    mask = np.int64(state.shape[0] - 1)
    if state[(i + 1) & mask] != EMPTY:
        state[i] = TOMBSTONE
        return True, np.int64(1)
    state[i] = EMPTY
    freed = np.int64(0)
    j = (i - 1) & mask
    while state[j] == TOMBSTONE:
        state[j] = EMPTY
        freed += 1
        j = (j - 1) & mask
    return True, -freed


@numba.njit(cache=True)
def rehash_into(
    hi: np.ndarray,
    lo: np.ndarray,
    state: np.ndarray,
    tier: np.ndarray,
    slot: np.ndarray,
    new_hi: np.ndarray,
    new_lo: np.ndarray,
    new_state: np.ndarray,
    new_tier: np.ndarray,
    new_slot: np.ndarray,
) -> np.int64:
    """Copy every FULL bucket into the (all-EMPTY) new arrays; returns the count.

    The new capacity must be a power of two with room for every live key.
    """
    mask = np.int64(new_state.shape[0] - 1)
    n = np.int64(0)
    for j in range(state.shape[0]):
        if state[j] != FULL:
            continue
        khi = hi[j]
        klo = lo[j]
        i = _home(khi, klo, mask)
        while new_state[i] != EMPTY:
            i = (i + 1) & mask
        new_hi[i] = khi
        new_lo[i] = klo
        new_tier[i] = tier[j]
        new_slot[i] = slot[j]
        new_state[i] = FULL
        n += 1
    return n


@numba.njit(cache=True)
def prefix_match(hi: np.ndarray, lo: np.ndarray, state: np.ndarray, keys: np.ndarray) -> np.int64:
    """Number of leading rows of ``keys`` (``uint64[n, 2]``) present in the table."""
    n = keys.shape[0]
    for k in range(n):
        if _find(hi, lo, state, keys[k, 0], keys[k, 1]) < 0:
            return np.int64(k)
    return np.int64(n)


@numba.njit(cache=True)
def contains_many(
    hi: np.ndarray, lo: np.ndarray, state: np.ndarray, keys: np.ndarray
) -> np.ndarray:
    """``bool[n]``: whether each row of ``keys`` (``uint64[n, 2]``) is present."""
    n = keys.shape[0]
    out = np.empty(n, dtype=np.bool_)
    for k in range(n):
        out[k] = _find(hi, lo, state, keys[k, 0], keys[k, 1]) >= 0
    return out


@numba.njit(cache=True)
def lookup_many(
    hi: np.ndarray, lo: np.ndarray, state: np.ndarray, slot: np.ndarray, keys: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(found: bool[n], slot: int64[n])`` for each row of ``keys``; slot is -1 where absent."""
    n = keys.shape[0]
    found = np.empty(n, dtype=np.bool_)
    out = np.empty(n, dtype=np.int64)
    for k in range(n):
        i = _find(hi, lo, state, keys[k, 0], keys[k, 1])
        if i < 0:
            found[k] = False
            out[k] = -1
        else:
            found[k] = True
            out[k] = slot[i]
    return found, out
