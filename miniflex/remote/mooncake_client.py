"""Mooncake Store's client as :class:`~miniflex.remote.mooncake_store.MooncakeStore` uses it:
set up on first use, its error codes turned into exceptions.

Every method here blocks for as long as Mooncake lets it (up to 30 s for a hung holder or
master, 90 s to set up against an absent master): call them only on the helper threads of
:class:`~miniflex.remote.deadline.DeadlineCalls`. The codes are Mooncake's ``ErrorCode``
(``mooncake-store/include/types.h``); those named here are the ones MiniFlex tells apart.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from mooncake.store import MooncakeDistributedStore

from miniflex.config.mooncake_url import MooncakeTarget

__all__ = ["MISSING", "NO_ROOM", "TOO_SMALL", "MooncakeClient", "MooncakeCodeError"]

LOCAL_BUFFER_BYTES = 16 << 20
"""The client's own buffer (only the start-up probe's small value goes through it)."""
MISSING = (-704, -703)
"""OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY: a miss."""
TOO_SMALL = -600
"""INVALID_PARAMS: what a read into a buffer smaller than the value answers."""
NO_ROOM = -200
"""NO_AVAILABLE_HANDLE: no holder has room for a put (or none has mounted memory)."""
_CODE_NAMES = {
    -1: "INTERNAL_ERROR",
    -200: "NO_AVAILABLE_HANDLE: no holder has room",
    -600: "INVALID_PARAMS",
    -704: "OBJECT_NOT_FOUND",
    -706: "OBJECT_HAS_LEASE",
    -800: "TRANSFER_FAIL",
    -900: "RPC_FAIL",
    -901: "RPC_TIMEOUT",
}


class MooncakeCodeError(Exception):
    """A Mooncake call answered an error code."""

    def __init__(self, what: str, code: int) -> None:
        name = _CODE_NAMES.get(code, "see Mooncake's ErrorCode")
        super().__init__(f"{what}: Mooncake error {code} ({name})")
        self.code = code

    @property
    def unreachable(self) -> bool:
        """The master, metadata server or holder could not be reached (else: it said no)."""
        return self.code == -1 or self.code <= -800


class MooncakeClient:
    """One ``MooncakeDistributedStore`` of ``target``, lending the store no memory, set up by
    the first call that needs it (others fail at once meanwhile); thread safe."""

    def __init__(self, target: MooncakeTarget, connect_timeout_s: float) -> None:
        self.target = target
        self.rdma = target.transport() == "rdma"
        self._connect_timeout_s = connect_timeout_s
        self._client: Any = None
        self._setup_lock = threading.Lock()
        self._registered: set[int] = set()

    @property
    def set_up(self) -> bool:
        return self._client is not None

    def ready(self) -> Any:
        """The set-up client; ConnectionError while another call sets it up, OSError if
        the master or metadata server refuses a connection, MooncakeCodeError if set-up fails."""
        client = self._client
        if client is not None:
            return client
        if not self._setup_lock.acquire(blocking=False):
            raise ConnectionError("the Mooncake client is still being set up")
        try:
            if self._client is None:
                self._client = self._new()
            return self._client
        finally:
            self._setup_lock.release()

    def _new(self) -> Any:
        target = self.target
        for host, port in target.endpoints():  # refused at once, not after 90 s of retries
            socket.create_connection((host, port), timeout=self._connect_timeout_s).close()
        client = MooncakeDistributedStore()
        rc = client.setup(
            target.hostname(),
            target.metadata,
            0,  # no segment: holders lend the memory
            LOCAL_BUFFER_BYTES,
            target.transport(),
            target.devices,
            target.master,
        )
        if rc != 0:
            raise MooncakeCodeError(f"set-up with master {target.master}", rc)
        return client

    def lend(self, client: Any, buf: np.ndarray) -> int:
        """``buf``'s address, registered with the client first where RDMA needs it."""
        ptr = int(buf.ctypes.data)
        if self.rdma and ptr not in self._registered:
            rc = client.register_buffer(ptr, buf.nbytes)
            if rc != 0:
                raise MooncakeCodeError("registering a buffer", rc)
            self._registered.add(ptr)
        return ptr

    def probe(self, name: str) -> None:
        """Put, size and remove a small value under ``name``; MooncakeCodeError on failure."""
        client = self.ready()
        for what, rc in (("put", client.upsert(name, b"probe")), ("get", client.get_size(name))):
            if rc < 0:
                raise MooncakeCodeError(f"probe {what}", rc)
        client.remove(name, True)

    def size(self, name: str) -> int:
        """The size of the value under ``name``; -1 if there is none."""
        size = int(self.ready().get_size(name))
        if size in MISSING:
            return -1
        if size < 0:
            raise MooncakeCodeError("get", size)
        return size

    def remove(self, name: str) -> bool:
        """Remove ``name`` (despite the read lease a get leaves); whether it was there."""
        rc = self.ready().remove(name, True)
        if rc in MISSING:
            return False
        if rc != 0:
            raise MooncakeCodeError("delete", rc)
        return True

    def exist(self, names: Sequence[str]) -> list[bool]:
        found = self.ready().batch_is_exist(list(names))
        if len(found) != len(names) or min(found) < 0:
            raise MooncakeCodeError("exists", -1)
        return [n == 1 for n in found]

    def close(self, idle: Sequence[np.ndarray]) -> None:
        """Unregister those of ``idle`` that were registered, and close the client."""
        if self._client is None:
            return
        for buf in idle:
            if int(buf.ctypes.data) in self._registered:
                self._client.unregister_buffer(int(buf.ctypes.data))
        self._client.close()
