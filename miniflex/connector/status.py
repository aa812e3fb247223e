"""The scheduler's live state as a JSON file, for ``miniflex inspect`` and monitoring.

The scheduler thread hands :class:`StatusWriter` snapshots of its state
(:meth:`~StatusWriter.update`); a thread of the writer's own rewrites the file
every ``interval`` seconds, idle or not, so ``written_at`` says the engine
process is alive and ``state_at`` how old the state is. The writer never reads
the scheduler's objects itself. Each write goes to a temporary file that is
renamed over ``path``, so a reader never sees a half-written file. A failed
write is logged once and never disturbs serving.

File fields besides the state: ``written_at``, ``state_at`` (Unix times),
``interval_s``, ``pid`` (the engine's scheduler process) and ``host``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any

__all__ = ["StatusWriter"]

logger = logging.getLogger("miniflex.connector")


class StatusWriter:
    """Writes the latest snapshot to ``path`` every ``interval`` seconds, from its own thread."""

    def __init__(self, path: str, interval: float = 1.0) -> None:
        self.path = path
        self.interval = interval
        self._lock = threading.Lock()
        self._state: dict[str, Any] = {}
        self._state_at = time.time()
        self._warned = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def update(self, state: dict[str, Any]) -> None:
        """The scheduler's state now (a fresh dict the caller no longer changes)."""
        with self._lock:
            self._state, self._state_at = state, time.time()

    def start(self) -> None:
        """Write now, then every ``interval`` seconds until :meth:`close`."""
        self.write()
        self._thread = threading.Thread(target=self._run, name="miniflex-status", daemon=True)
        self._thread.start()

    def close(self, final: dict[str, Any] | None = None) -> None:
        """Stop the thread and write ``final`` (or the last snapshot) once more."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if final is not None:
            self.update(final)
        self.write()

    def write(self) -> bool:
        """Write the file now; False (logged once) if the file system refused."""
        with self._lock:
            data = {
                "written_at": time.time(),
                "state_at": self._state_at,
                "interval_s": self.interval,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                **self._state,
            }
        tmp = f"{self.path}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, default=str)
            os.replace(tmp, self.path)
        except OSError as exc:
            if not self._warned:
                logger.warning("MiniFlex cannot write its status file %s: %s", self.path, exc)
                self._warned = True
            return False
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()
