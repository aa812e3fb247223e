"""`HashIndex`: chunk key -> (tier, slot) map backed by a compiled open-addressing table.

The table lives in five numpy arrays (see :mod:`miniflex.index._kernels`) and
every operation is one call into a Numba-compiled kernel, so batch operations
such as :meth:`HashIndex.prefix_match` over thousands of keys run without any
per-key Python overhead.
"""

from __future__ import annotations

import functools
import operator
import struct
from collections.abc import Iterator
from types import ModuleType

import numpy as np

from miniflex.errors import TierFullError
from miniflex.index.key_words import keys_to_array, split_key
from miniflex.types import ChunkKey, SlotId, Tier

__all__ = ["HashIndex", "compile_kernels"]

_MIN_CAPACITY = 16
_WORD_SPAN = 1 << 64
_SIGN_BIT = 1 << 63
_SIGNED_WORDS = struct.Struct("<qq")  # a key's 16 little-endian bytes as (lo, hi) int64
_SLOT_LIMIT = 1 << 63
_U64 = np.dtype(np.uint64)


def _kernels() -> ModuleType:
    """The compiled kernels, imported on first use rather than with this module.

    Importing numba loads llvmlite, whose FFI object answers any attribute
    lookup; vLLM's worker start-up scans every loaded module's attributes and
    crashes on it in worker processes forked afterwards. Deferring the import
    to the first ``HashIndex`` keeps numba out of processes that only import
    MiniFlex (the vLLM front end, scripts that start ``LLM``).
    """
    from miniflex.index import _kernels as kernels

    return kernels


def _tier_table() -> tuple[Tier | None, ...]:
    """Tier member by value, as a tuple (immutable) to skip ``Enum.__call__`` on hot paths."""
    by_value = {int(m): m for m in Tier}
    return tuple(by_value.get(v) for v in range(max(by_value) + 1))


_TIER_BY_VALUE = _tier_table()


def _rehash_limit(capacity: int) -> int:
    """Most FULL + TOMBSTONE buckets allowed in a table of ``capacity`` (70%)."""
    return capacity * 7 // 10


def _max_capacity(max_entries: int) -> int:
    """Smallest power of two >= 16 holding ``max_entries`` at <= 5/8 load.

    5/8 (< the 70% rehash trigger) guarantees that a table at this size, even
    when full of live keys, frees >= 7.5% of its buckets on an in-place rehash,
    so tombstone cleanup stays amortised O(1) at the entry cap.
    """
    cap = _MIN_CAPACITY
    while max_entries * 8 > cap * 5:
        cap *= 2
    return cap


def _words(key: int) -> tuple[int, int]:
    """``(hi, lo)`` words of ``key`` as int64 bit patterns, the form the kernels take.

    A word ``w >= 2**63`` becomes ``w - 2**64`` so that numba always types it as
    int64 (see :mod:`miniflex.index._kernels`). Invalid keys raise like
    :func:`~miniflex.index.key_words.split_key`.
    """
    try:
        # Fast path (quicker than shifts and masks): the little-endian bytes
        # of the key are lo then hi; to_bytes rejects keys outside [0, 2**128).
        lo, hi = _SIGNED_WORDS.unpack(int.to_bytes(key, 16, "little"))
    except (OverflowError, TypeError):
        uhi, ulo = split_key(key)  # raises the readable error, or accepts numpy ints
        hi = uhi - _WORD_SPAN if uhi >= _SIGN_BIT else uhi
        lo = ulo - _WORD_SPAN if ulo >= _SIGN_BIT else ulo
    return hi, lo


def _key_array(keys: np.ndarray) -> np.ndarray:
    """Validate a batch of keys as made by :func:`~miniflex.index.key_words.keys_to_array`."""
    if (
        type(keys) is np.ndarray
        and keys.ndim == 2
        and keys.shape[1] == 2
        and (keys.dtype is _U64 or keys.dtype == _U64)
    ):
        return keys if keys.flags.c_contiguous else np.ascontiguousarray(keys)
    if not isinstance(keys, np.ndarray):
        raise TypeError(
            f"expected a (n, 2) uint64 numpy array (see keys_to_array), got {type(keys).__name__}"
        )
    if keys.size == 0:
        return np.empty((0, 2), dtype=np.uint64)
    if keys.dtype != np.uint64 or keys.ndim != 2 or keys.shape[1] != 2:
        raise ValueError(
            "expected a (n, 2) uint64 array of [hi, lo] words (see keys_to_array), "
            f"got shape {keys.shape} dtype {keys.dtype}"
        )
    return np.ascontiguousarray(keys)


class HashIndex:
    """Map from 128-bit chunk keys to ``(Tier, SlotId)``, holding at most ``max_entries`` keys.

    Contract:
        * Keys are ints in ``[0, 2**128)``; any other key raises ``ValueError``
          (``TypeError`` for non-integers) from every method taking a key.
        * Slots are ints in ``[0, 2**63)``; tiers are :class:`~miniflex.types.Tier`.
        * ``len(self) <= max_entries`` always; adding a new key beyond it raises
          :class:`~miniflex.errors.TierFullError` and leaves the index unchanged.
        * Internally ``(live + tombstones) / capacity <= 0.7`` after every
          operation (so probes always terminate); ``capacity`` is a power of
          two, starts small and doubles when live keys alone would fill more
          than half of it, up to the size ``max_entries`` needs.
        * Not thread-safe: callers serialise access.
    """

    __slots__ = (
        "_cap",
        "_hi",
        "_k",
        "_live",
        "_lo",
        "_max",
        "_max_cap",
        "_slot",
        "_state",
        "_tier",
        "_tomb",
    )

    def __init__(self, max_entries: int) -> None:
        """Create an empty index holding at most ``max_entries`` (>= 1) keys."""
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be an int >= 1, got {max_entries!r}")
        self._k = _kernels()
        self._max = max_entries
        self._max_cap = _max_capacity(max_entries)
        self._allocate(_MIN_CAPACITY)

    # ------------------------------------------------------------------ storage

    def _allocate(self, capacity: int) -> None:
        """Replace the table by an empty one of ``capacity`` buckets."""
        self._cap = capacity
        self._hi = np.zeros(capacity, dtype=np.uint64)
        self._lo = np.zeros(capacity, dtype=np.uint64)
        self._state = np.zeros(capacity, dtype=np.uint8)
        self._tier = np.zeros(capacity, dtype=np.int8)
        self._slot = np.zeros(capacity, dtype=np.int64)
        self._live = 0
        self._tomb = 0

    def _make_room(self) -> None:
        """Rehash if one more key would push FULL + TOMBSTONE buckets past 70%.

        Rehashes in place (dropping tombstones) unless live keys plus the new
        one would fill more than half of the table; then doubles, up to the
        capacity ``max_entries`` needs.
        """
        needed = self._live + 1
        if needed + self._tomb <= _rehash_limit(self._cap):
            return
        new_cap = self._cap
        while needed * 2 > new_cap and new_cap < self._max_cap:
            new_cap *= 2
        old = (self._hi, self._lo, self._state, self._tier, self._slot)
        live = self._live
        self._allocate(new_cap)
        moved = self._k.rehash_into(*old, self._hi, self._lo, self._state, self._tier, self._slot)
        assert moved == live, (moved, live)
        self._live = live
        assert needed <= _rehash_limit(new_cap), (needed, new_cap)

    # --------------------------------------------------------------- single key

    def insert(self, key: int, tier: Tier, slot: SlotId) -> bool:
        """Map ``key`` to ``(tier, slot)``, replacing any previous mapping.

        Returns:
            True if ``key`` was not present before.

        Raises:
            TierFullError: ``key`` is new and the index already holds
                ``max_entries`` keys (updating a present key always works).
            ValueError: ``key``, ``tier`` or ``slot`` is out of range.
        """
        khi, klo = _words(key)
        t = int(tier if type(tier) is Tier else Tier(tier))
        s = operator.index(slot)
        if not 0 <= s < _SLOT_LIMIT:
            raise ValueError(f"slot must be in [0, 2**63), got {slot!r}")
        allow_new = self._live < self._max
        if allow_new:
            self._make_room()
        arrays = (self._hi, self._lo, self._state, self._tier, self._slot)
        code = self._k.insert(*arrays, khi, klo, t, s, allow_new)
        if code == self._k.UPDATED:
            return False
        if code == self._k.REFUSED:
            raise TierFullError(
                f"hash index is full: it already holds max_entries={self._max} keys; "
                "delete or evict one before inserting a new key"
            )
        self._live += 1
        if code == self._k.INSERTED_TOMBSTONE:
            self._tomb -= 1
        return True

    def lookup(self, key: int) -> tuple[Tier, SlotId] | None:
        """``(tier, slot)`` stored for ``key``, or None if it is absent."""
        khi, klo = _words(key)
        t, s = self._k.lookup(self._hi, self._lo, self._state, self._tier, self._slot, khi, klo)
        if t < 0:
            return None
        found_tier = _TIER_BY_VALUE[t]
        assert found_tier is not None, t
        return found_tier, SlotId(s)

    def delete(self, key: int) -> bool:
        """Remove ``key``; returns True if it was present (absent keys are a no-op)."""
        khi, klo = _words(key)
        found, tomb_delta = self._k.delete(self._hi, self._lo, self._state, khi, klo)
        if found:
            self._live -= 1
            self._tomb += tomb_delta
        return found

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is present (invalid keys raise like :meth:`lookup`)."""
        khi, klo = _words(key)  # type: ignore[arg-type]
        return self._k.find(self._hi, self._lo, self._state, khi, klo) >= 0

    # -------------------------------------------------------------------- batch

    def prefix_match(self, keys: np.ndarray) -> int:
        """Number of leading keys of ``keys`` present, stopping at the first miss.

        ``keys`` is a ``(n, 2)`` uint64 array from
        :func:`~miniflex.index.key_words.keys_to_array`; an empty array gives 0.
        One compiled call, no per-key Python work.
        """
        arr = _key_array(keys)
        return int(self._k.prefix_match(self._hi, self._lo, self._state, arr))

    def lookup_many(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Look up every row of a ``(n, 2)`` uint64 key array in one compiled call.

        Returns:
            ``(found, slot)``: ``found`` is ``bool[n]``; ``slot`` is ``int64[n]``
            and ``slot[i]`` is the stored slot where ``found[i]`` and undefined
            (do not read it) elsewhere.
        """
        arr = _key_array(keys)
        return self._k.lookup_many(self._hi, self._lo, self._state, self._slot, arr)

    def contains_many(self, keys: np.ndarray) -> np.ndarray:
        """``bool[n]``: whether each row of a ``(n, 2)`` uint64 key array is present."""
        arr = _key_array(keys)
        return self._k.contains_many(self._hi, self._lo, self._state, arr)

    # -------------------------------------------------------------- whole table

    def __len__(self) -> int:
        """Number of keys present."""
        return self._live

    def items(self) -> Iterator[tuple[ChunkKey, Tier, SlotId]]:
        """Iterate ``(key, tier, slot)`` over a snapshot taken when this is called.

        Order is unspecified. Changing the index while iterating is allowed and
        does not affect the iteration.
        """
        full = np.flatnonzero(self._state == self._k.FULL)
        rows = zip(
            self._hi[full].tolist(),
            self._lo[full].tolist(),
            self._tier[full].tolist(),
            self._slot[full].tolist(),
            strict=True,
        )
        return ((ChunkKey((hi << 64) | lo), Tier(t), SlotId(s)) for hi, lo, t, s in rows)

    def clear(self) -> None:
        """Remove every key and shrink back to the initial capacity."""
        self._allocate(_MIN_CAPACITY)

    # -------------------------------------------------------------------- stats

    @property
    def max_entries(self) -> int:
        """Hard cap on the number of keys."""
        return self._max

    @property
    def capacity(self) -> int:
        """Number of buckets in the table (a power of two)."""
        return self._cap

    @property
    def tombstones(self) -> int:
        """Number of buckets holding a deleted key's tombstone."""
        return self._tomb

    def __repr__(self) -> str:
        return (
            f"HashIndex(len={self._live}, max_entries={self._max}, "
            f"capacity={self._cap}, tombstones={self._tomb})"
        )


@functools.cache
def compile_kernels() -> None:
    """Run every compiled kernel once per process, on a throw-away index.

    Numba compiles a kernel at its first call (or loads it from its on-disk
    cache), holding the interpreter meanwhile, longest on a fresh install.
    Called when a tier is built, so that no serving step pays it; without this
    the first eviction of a fresh engine (the first ``delete``) stalls a
    request while its kernel compiles.
    """
    index = HashIndex(max_entries=4 * _MIN_CAPACITY)
    keys = [ChunkKey((i + 1) * 0x9E3779B97F4A7C15) for i in range(2 * _MIN_CAPACITY)]
    for i, key in enumerate(keys):  # grows past the first table: rehash_into
        index.insert(key, Tier.CPU, SlotId(i))
    arr = keys_to_array(keys)
    index.prefix_match(arr)
    index.lookup_many(arr)
    index.contains_many(arr)
    index.lookup(keys[0])
    _ = keys[0] in index
    index.delete(keys[0])
