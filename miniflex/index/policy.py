"""Eviction policies: which slot of a tier to free next, honouring pins.

A policy tracks the slots ``0 .. num_slots - 1`` of one tier. A slot is
*resident* from :meth:`~EvictionPolicy.touch` until it is removed or evicted,
and *pinned* while its pin count is positive. Only resident, unpinned slots
are eviction candidates.

Both built-in policies keep an intrusive doubly-linked list of candidates in
numpy arrays indexed by slot (``prev`` / ``next``, with a sentinel at index
``num_slots`` acting as head and tail), plus a pin-count array and a residency
array, so every operation is O(1) and memory is a few bytes per slot.

Implementation note: the list operations are plain Python working on
``memoryview`` objects of those numpy arrays (the arrays stay the storage).
A full ``touch`` is quicker this way than as one ``numba.njit`` call (argument
unboxing dominates such tiny kernels) or indexing the numpy arrays directly.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

import numpy as np

from miniflex.types import SlotId

__all__ = ["POLICIES", "EvictionPolicy", "FIFOPolicy", "LRUPolicy", "make_policy"]


class EvictionPolicy(ABC):
    """Chooses eviction victims among the resident, unpinned slots of one tier.

    Contract (for slot ids ``0 <= slot < num_slots``; other ids raise
    ``IndexError`` from every method except ``in``, which answers False):

    * :meth:`touch` makes a slot resident and records a use of it.
    * :meth:`touch_cold` makes a slot resident as the first victim (cold) until
      a :meth:`touch`.
    * :meth:`remove` forgets a freed slot; a no-op for a slot not resident.
    * :meth:`pin` / :meth:`unpin` raise / lower the slot's pin count. Pin
      counts are independent of residency: a slot may be pinned before it is
      touched (e.g. while its data is being written) and :meth:`remove` does
      not reset the count. Unpinning a slot whose count is 0 is a caller bug
      and raises ``AssertionError``.
    * :meth:`evict` removes and returns the policy's victim among resident
      slots with pin count 0, or None when there is none. It is always safe to
      call and never returns a pinned slot.
    * ``len()`` counts resident slots, pinned ones included.
    * Not thread-safe: callers serialise access.
    """

    __slots__ = ()

    @property
    @abstractmethod
    def num_slots(self) -> int:
        """Number of slot ids this policy tracks (ids are ``0 .. num_slots - 1``)."""

    @abstractmethod
    def touch(self, slot: SlotId) -> None:
        """Make ``slot`` resident and record a use of it.

        A pinned slot stays pinned; the use only affects where it goes once it
        is unpinned (if the policy cares about recency at all).
        """

    @abstractmethod
    def touch_cold(self, slot: SlotId) -> None:
        """Make ``slot`` resident as the next victim, ahead of every other candidate.

        For data few requests will use again: it stays while nothing needs its
        slot and is evicted first. While pinned it keeps that place for when it
        is unpinned. A later :meth:`touch` counts as a use and ends the cold
        standing. On a slot already resident and not cold this changes nothing.
        """

    @abstractmethod
    def remove(self, slot: SlotId) -> None:
        """Forget ``slot`` (its data was freed); no-op if it is not resident."""

    @abstractmethod
    def pin(self, slot: SlotId) -> None:
        """Increment ``slot``'s pin count; while positive, :meth:`evict` skips it."""

    @abstractmethod
    def unpin(self, slot: SlotId) -> None:
        """Decrement ``slot``'s pin count.

        Raises:
            AssertionError: the pin count is already 0 (unbalanced unpin).
        """

    @abstractmethod
    def evict(self) -> SlotId | None:
        """Remove and return the victim slot; None if no resident slot is unpinned.

        Always safe to call: with nothing resident, or everything pinned, it
        returns None and changes nothing.
        """

    @abstractmethod
    def is_pinned(self, slot: SlotId) -> bool:
        """Whether ``slot``'s pin count is positive."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of resident slots, pinned ones included."""

    @abstractmethod
    def __contains__(self, slot: object) -> bool:
        """Whether ``slot`` is resident (False for ids outside the range)."""

    def num_pinned(self) -> int:
        """Number of slots whose pin count is positive (resident or not)."""
        return sum(1 for s in range(self.num_slots) if self.is_pinned(SlotId(s)))


class _ListPolicy(EvictionPolicy):
    """Shared intrusive-list machinery; the list runs from LRU/oldest (head) to MRU (tail).

    A slot is linked in the list exactly when it is resident and unpinned.
    Subclasses set ``_MOVE_ON_TOUCH``: whether touching a linked slot moves it
    to the tail.
    """

    _MOVE_ON_TOUCH: ClassVar[bool]

    __slots__ = ("_cold", "_count", "_n", "_next", "_pins", "_prev", "_res", "_storage")

    def __init__(self, num_slots: int) -> None:
        """Track ``num_slots`` (>= 0) slots, none resident or pinned."""
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 0:
            raise ValueError(f"num_slots must be an int >= 0, got {num_slots!r}")
        n = num_slots
        prev = np.empty(n + 1, dtype=np.int64)
        nxt = np.empty(n + 1, dtype=np.int64)
        prev[n] = n  # empty circular list: the sentinel points at itself
        nxt[n] = n
        pins = np.zeros(n, dtype=np.int32)
        res = np.zeros(n, dtype=np.uint8)
        cold = np.zeros(n, dtype=np.uint8)  # linked (or to be linked) at the head
        self._storage = (prev, nxt, pins, res, cold)  # keeps the buffers alive, inspectable
        self._prev = memoryview(prev)
        self._next = memoryview(nxt)
        self._pins = memoryview(pins)
        self._res = memoryview(res)
        self._cold = memoryview(cold)
        self._n = n
        self._count = 0

    def _check(self, slot: SlotId) -> int:
        s = slot if type(slot) is int else operator.index(slot)
        if not 0 <= s < self._n:
            raise IndexError(f"slot {slot!r} out of range for a policy of {self._n} slots")
        return s

    def _unlink(self, s: int) -> None:
        prev = self._prev
        nxt = self._next
        p = prev[s]
        q = nxt[s]
        nxt[p] = q
        prev[q] = p

    def _link_after(self, a: int, s: int) -> None:
        """Link ``s`` right after ``a`` (the sentinel ``n``: at the head)."""
        nxt = self._next
        b = nxt[a]
        nxt[a] = s
        self._prev[s] = a
        nxt[s] = b
        self._prev[b] = s

    def _link_tail(self, s: int) -> None:
        self._link_after(self._prev[self._n], s)

    def _link_head(self, s: int) -> None:
        self._link_after(self._n, s)

    @property
    def num_slots(self) -> int:
        return self._n

    def touch(self, slot: SlotId) -> None:
        s = self._check(slot)
        if self._res[s]:
            was_cold = self._cold[s]
            self._cold[s] = 0
            if (self._MOVE_ON_TOUCH or was_cold) and not self._pins[s]:
                self._unlink(s)
                self._link_tail(s)
            return
        self._res[s] = 1
        self._cold[s] = 0
        self._count += 1
        if not self._pins[s]:
            self._link_tail(s)

    def touch_cold(self, slot: SlotId) -> None:
        s = self._check(slot)
        if self._res[s]:
            return
        self._res[s] = 1
        self._cold[s] = 1
        self._count += 1
        if not self._pins[s]:
            self._link_head(s)

    def remove(self, slot: SlotId) -> None:
        s = self._check(slot)
        if not self._res[s]:
            return
        self._res[s] = 0
        self._cold[s] = 0
        self._count -= 1
        if not self._pins[s]:
            self._unlink(s)

    def pin(self, slot: SlotId) -> None:
        s = self._check(slot)
        count = self._pins[s] + 1
        self._pins[s] = count
        if count == 1 and self._res[s]:
            self._unlink(s)

    def unpin(self, slot: SlotId) -> None:
        s = self._check(slot)
        count = self._pins[s]
        if count <= 0:
            raise AssertionError(f"unpin of slot {s}, which is not pinned")
        self._pins[s] = count - 1
        if count == 1 and self._res[s]:
            if self._cold[s]:
                self._link_head(s)
            else:
                self._link_tail(s)

    def evict(self) -> SlotId | None:
        s = self._next[self._n]
        if s == self._n:
            return None
        self._unlink(s)
        self._res[s] = 0
        self._cold[s] = 0
        self._count -= 1
        return SlotId(s)

    def is_pinned(self, slot: SlotId) -> bool:
        return self._pins[self._check(slot)] > 0

    def __len__(self) -> int:
        return self._count

    def num_pinned(self) -> int:
        return int(np.count_nonzero(self._storage[2]))

    def __contains__(self, slot: object) -> bool:
        try:
            s = operator.index(slot)  # type: ignore[call-overload]
        except TypeError:
            return False
        return 0 <= s < self._n and bool(self._res[s])

    def __repr__(self) -> str:
        pinned = int(np.count_nonzero(self._storage[2]))
        return (
            f"{type(self).__name__}(num_slots={self._n}, resident={self._count}, pinned={pinned})"
        )


class LRUPolicy(_ListPolicy):
    """Evicts the least recently used unpinned slot.

    Uses are :meth:`touch` and the moment a slot's pin count drops back to 0
    (it then counts as just used; a cold slot goes back to the head instead).
    """

    _MOVE_ON_TOUCH = True
    __slots__ = ()


class FIFOPolicy(_ListPolicy):
    """Evicts the unpinned slot that became a candidate earliest.

    A slot becomes a candidate when first touched, or again when its pin count
    drops back to 0 (it then joins the back of the queue); touching a slot that
    is already resident does not move it.
    """

    _MOVE_ON_TOUCH = False
    __slots__ = ()


POLICIES: Mapping[str, type[EvictionPolicy]] = MappingProxyType(
    {"lru": LRUPolicy, "fifo": FIFOPolicy}
)
"""Policy classes by configuration name (read-only)."""


def make_policy(name: str, num_slots: int) -> EvictionPolicy:
    """Build the policy called ``name`` (case-insensitive) over ``num_slots`` slots.

    Raises:
        ValueError: ``name`` is not a key of :data:`POLICIES` (the message lists them),
            or ``num_slots`` is negative.
    """
    cls = POLICIES.get(name.lower()) if isinstance(name, str) else None
    if cls is None:
        valid = ", ".join(repr(k) for k in sorted(POLICIES))
        raise ValueError(f"unknown eviction policy {name!r}; valid names: {valid}")
    return cls(num_slots)  # type: ignore[call-arg]
