"""The MiniFlex exception hierarchy.

Anything a user, the operating system or a capacity limit can cause is raised
as a :class:`MiniFlexError` subclass with a message a person can act on.
Internal invariants use ``assert`` instead.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "IOBackendError",
    "MiniFlexError",
    "RemoteError",
    "TierFullError",
    "TransferError",
]


class MiniFlexError(Exception):
    """Base class of every error MiniFlex raises on purpose."""


class ConfigError(MiniFlexError, ValueError):
    """A configuration value is unknown, malformed or does not fit the machine.

    The message always names the key, the offending value and what would be
    accepted, e.g. ``cpu_bytes='8XB': expected bytes as an integer or a size
    such as '8GiB'``.
    """

    def __init__(self, key: str, value: object, accepted: str) -> None:
        self.key = key
        self.value = value
        self.accepted = accepted
        super().__init__(f"MiniFlex config {key}={value!r}: {accepted}")


class TierFullError(MiniFlexError):
    """A tier has no free slot and nothing in it may be evicted (all pinned)."""


class TransferError(MiniFlexError):
    """Moving KV bytes between vLLM's cache and a tier failed."""


class RemoteError(MiniFlexError):
    """The remote store refused MiniFlex's settings: credentials, TLS or permissions.

    Raised only by a start-up check, never by a put or get (those count their
    failures). The message is one line that names the store, what it said and
    the config keys to fix, e.g. ``remote store redis://10.0.0.5:6379 refused
    the credentials of user 'default' (WRONGPASS ...): check remote_user and
    remote_password / remote_password_file``.
    """


class IOBackendError(MiniFlexError, OSError):
    """An SSD read or write failed; carries the file, offset and length."""

    def __init__(self, errno_: int, path: str, offset: int, length: int, op: str) -> None:
        import os

        self.path = path
        self.offset = offset
        self.length = length
        self.op = op
        msg = f"{op} of {length} bytes at offset {offset} in {path} failed: {os.strerror(errno_)}"
        super().__init__(errno_, msg)
