"""Blocking client calls with a deadline, and the private buffers they read into and write from.

A client library whose calls cannot be given a timeout (Mooncake Store's waits up to 30 s
for a hung holder or master, and 90 s to connect to an absent one) is called through
:class:`DeadlineCalls`: each call runs on a helper thread, and the caller waits at most the
deadline. A call still running then is *late*: the caller has already answered (a counted
failure), and the late call ends whenever the library lets it, with nobody waiting.

A late call may still write into, or read from, the memory it was given. So a call is never
handed a buffer its caller owns (a CPU slot that will be reused, a chunk the caller will
change): it is given :class:`StagingPool` buffers, and a buffer of a late call goes back
to the pool only when that call has ended (``on_late``). A late write therefore lands in a
buffer nobody else uses, never in a slot that holds another chunk by then::

    calls, staging = DeadlineCalls(max_late=4), StagingPool()
    buf = staging.take(nbytes)
    try:
        n = calls.run(lambda: client.get_into(name, buf.ctypes.data, nbytes), 1.0,
                      on_late=lambda: staging.give(buf))
    except CallTimeout:
        ...  # counted; buf now belongs to the late call
    else:
        ...  # verify buf, copy it into the slot
        staging.give(buf)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np

__all__ = ["CallTimeout", "DeadlineCalls", "StagingPool", "TooManyLate"]

T = TypeVar("T")
_ALIGN = 64 << 10
"""Staging buffers are allocated in multiples of this (a chunk's buffer wastes less than it)."""


class CallTimeout(Exception):
    """The call did not end within its deadline; it goes on as a late call."""


class TooManyLate(Exception):
    """``max_late`` calls are still late: no new one is started until one ends."""


class _Call(Generic[T]):
    __slots__ = ("done", "error", "fn", "late", "on_late", "result")

    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None
        self.late = False
        self.on_late: Callable[[], None] | None = None


class DeadlineCalls:
    """Runs calls on helper threads, waiting for each at most its deadline; thread safe."""

    def __init__(self, max_late: int = 4, name: str = "miniflex-call") -> None:
        self._max_late = max_late
        self._name = name
        self._lock = threading.Lock()
        self._late = 0

    @property
    def late(self) -> int:
        """Calls that outlived their deadline and have not ended yet."""
        with self._lock:
            return self._late

    def run(
        self,
        fn: Callable[[], T],
        timeout_s: float,
        on_late: Callable[[], None] | None = None,
    ) -> T:
        """``fn()``'s result or exception, if it ends within ``timeout_s``.

        Raises CallTimeout otherwise (``on_late`` is then called on the helper thread once
        ``fn`` has ended, whatever its outcome), and TooManyLate without calling ``fn`` while
        ``max_late`` earlier calls are late.
        """
        with self._lock:
            if self._late >= self._max_late:
                raise TooManyLate(f"{self._late} earlier calls have not ended")
        call: _Call[T] = _Call(fn)
        threading.Thread(target=self._work, args=(call,), name=self._name, daemon=True).start()
        if not call.done.wait(timeout_s):
            with self._lock:
                if not call.done.is_set():  # else it ended just now: take its result
                    call.late, call.on_late = True, on_late
                    self._late += 1
                    raise CallTimeout(f"no answer within {timeout_s:.2f} s")
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[return-value]

    def _work(self, call: _Call[T]) -> None:
        try:
            call.result = call.fn()
        except BaseException as exc:  # handed to the waiting caller, or dropped if late
            call.error = exc
        with self._lock:
            call.done.set()
            late = call.late
            self._late -= int(late)
        if late and call.on_late is not None:
            call.on_late()


class StagingPool:
    """Byte buffers (1-D uint8 arrays) that client calls use instead of the caller's memory.

    Kept for reuse once given back, never dropped before :meth:`clear`: there are as many as
    calls were ever in flight at once (plus late ones). A buffer is allocated in whole 64 KiB,
    at least as large as asked. Thread safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[np.ndarray] = []
        self.allocated = 0
        """Bytes of every buffer this pool has allocated and not dropped."""

    def take(self, nbytes: int) -> np.ndarray:
        """An idle buffer of at least ``nbytes`` (the smallest that fits), or a new one."""
        with self._lock:
            fits = [i for i, b in enumerate(self._idle) if b.size >= nbytes]
            if fits:  # by position: arrays compare element by element
                return self._idle.pop(min(fits, key=lambda i: self._idle[i].size))
            size = max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
            self.allocated += size
        return np.empty(size, dtype=np.uint8)

    def give(self, buf: np.ndarray) -> None:
        """Take ``buf`` back: no call uses it any more."""
        with self._lock:
            self._idle.append(buf)

    def clear(self) -> list[np.ndarray]:
        """Drop the idle buffers; they are returned (e.g. to unregister them)."""
        with self._lock:
            idle, self._idle = self._idle, []
            self.allocated -= sum(b.size for b in idle)
        return idle
