"""The shared remote tier's store: one backend module per store behind :class:`RemoteStore`.

``open_remote_store(cfg, namespace_digest)`` returns the store ``remote_url``
names (Redis or Valkey today), or None. This package is the only place that
imports a store's client library, and only when a store is opened.
"""

from miniflex.remote.base import RemoteStats, RemoteStore
from miniflex.remote.envelope import CorruptValueError
from miniflex.remote.registry import BACKENDS, open_remote_store

__all__ = ["BACKENDS", "CorruptValueError", "RemoteStats", "RemoteStore", "open_remote_store"]
