"""The scheduler's live state as a JSON file, for ``miniflex inspect`` and monitoring.

Written at most every ``interval`` seconds from the scheduler's thread, to a
temporary file that is then renamed over ``path``, so a reader never sees a
half-written file. A failed write is logged once and never disturbs serving.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

__all__ = ["StatusWriter"]

logger = logging.getLogger("miniflex.connector")


class StatusWriter:
    """Calls ``payload()`` and writes it to ``path`` when ``interval`` seconds have passed."""

    def __init__(self, path: str, payload: Callable[[], dict[str, Any]], interval: float = 2.0):
        self.path = path
        self._payload = payload
        self._interval = interval
        self._last = float("-inf")
        self._warned = False

    def maybe_write(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if now - self._last < self._interval:
            return False
        self._last = now
        try:
            self.write()
        except OSError as exc:
            if not self._warned:
                logger.warning("MiniFlex cannot write its status file %s: %s", self.path, exc)
                self._warned = True
            return False
        return True

    def write(self) -> None:
        data = {"written_at": time.time(), "pid": os.getpid(), **self._payload()}
        tmp = f"{self.path}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, default=str)
        os.replace(tmp, self.path)
