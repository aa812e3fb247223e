"""Pick an SSD I/O backend by name, probing io_uring and falling back to threads.

``make_backend("auto")`` tries io_uring (a ring is set up and one NOP makes
the round trip, so seccomp filters and ``kernel.io_uring_disabled`` are caught
here, not at the first real read) and otherwise uses threads, logging which
backend was chosen and why on the ``miniflex.ssd`` logger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType

from miniflex.errors import ConfigError
from miniflex.ssd.base import BackendUnavailableError, IOBackend
from miniflex.ssd.threads import ThreadBackend
from miniflex.ssd.uring import UringBackend

__all__ = ["BACKENDS", "BACKEND_CHOICES", "describe_backend", "make_backend"]

log = logging.getLogger("miniflex.ssd")

BACKENDS: Mapping[str, Callable[[int], IOBackend]] = MappingProxyType(
    {"io_uring": UringBackend, "threads": ThreadBackend}
)
BACKEND_CHOICES = ("auto", *BACKENDS)


def make_backend(preferred: str = "auto", queue_depth: int = 64) -> IOBackend:
    """Return a ready backend; the caller owns it and must :meth:`~IOBackend.close` it.

    ``"auto"``: io_uring if it works here, else threads (logged as a warning
    with the reason). ``"io_uring"``: io_uring or :class:`BackendUnavailableError`
    saying why not. ``"threads"``: the thread pool. Anything else raises
    :class:`~miniflex.errors.ConfigError` (a ``ValueError``) listing the names.
    """
    if preferred not in BACKEND_CHOICES:
        choices = ", ".join(repr(c) for c in BACKEND_CHOICES)
        raise ConfigError("ssd_io", preferred, f"expected one of {choices}")
    if queue_depth < 1:
        raise ConfigError("ssd_queue_depth", queue_depth, "expected an integer >= 1")
    if preferred != "auto":
        backend = BACKENDS[preferred](queue_depth)
        log.info("SSD I/O backend: %s (requested), queue depth %d", preferred, queue_depth)
        return backend
    try:
        backend = UringBackend(queue_depth)
    except BackendUnavailableError as exc:
        log.warning("SSD I/O backend: threads, because io_uring is unavailable: %s", exc)
        return ThreadBackend(queue_depth)
    log.info("SSD I/O backend: io_uring (probed OK), queue depth %d", queue_depth)
    return backend


def describe_backend(preferred: str = "auto") -> str:
    """The backend ``make_backend(preferred)`` would pick here, and why, in a few words.

    For ``miniflex serve``'s pre-start report; a ring is set up and torn down.
    ``"io_uring"`` where io_uring cannot run raises ConfigError naming ``ssd_io``.
    """
    if preferred == "threads":
        return "threads (requested)"
    try:
        UringBackend(2).close()
    except BackendUnavailableError as exc:
        if preferred == "io_uring":
            raise ConfigError(
                "ssd_io", preferred, f"io_uring cannot run here ({exc}); use 'auto' or 'threads'"
            ) from None
        return f"threads, because io_uring is unavailable ({exc})"
    return "io_uring"
