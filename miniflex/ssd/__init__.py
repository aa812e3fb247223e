"""The SSD tier's block-I/O layer: O_DIRECT slot files and io_uring/thread backends.

``make_backend()`` returns an :class:`IOBackend`; ``open_direct()`` opens a
preallocated slot file; an :class:`IOOp` is one aligned read or write. This
package is the only place that imports ``cffi``.
"""

from miniflex.ssd.backends import BACKEND_CHOICES, BACKENDS, make_backend
from miniflex.ssd.base import BackendError, BackendUnavailableError, IOBackend, IOOp
from miniflex.ssd.files import open_direct
from miniflex.ssd.journal import SlotJournal
from miniflex.ssd.store import SSDStore
from miniflex.ssd.threads import ThreadBackend
from miniflex.ssd.uring import UringBackend

__all__ = [
    "BACKENDS",
    "BACKEND_CHOICES",
    "BackendError",
    "BackendUnavailableError",
    "IOBackend",
    "IOOp",
    "SSDStore",
    "SlotJournal",
    "ThreadBackend",
    "UringBackend",
    "make_backend",
    "open_direct",
]
