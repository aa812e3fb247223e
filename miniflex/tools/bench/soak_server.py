"""The server the soak drives: one it started itself, and may kill and restart.

Apart from :mod:`miniflex.tools.bench.soak_driver` (the wiring, which imports the
workload) so that the workload (:mod:`miniflex.tools.bench.soak`) can name it.
"""

from __future__ import annotations

from miniflex.ssd.store import rank_dirs
from miniflex.tools.bench.faults import SmallDisk
from miniflex.tools.bench.http import HttpDriver
from miniflex.tools.bench.model import PromptMaker
from miniflex.tools.bench.server import ServerProcess

__all__ = ["STOP_S", "ServerDriver"]

STOP_S = 30.0
"""How long a server stopped on the way out may take before it is killed."""


class ServerDriver(HttpDriver):
    """A server started (and stopped) here; the soak may kill and restart it."""

    def __init__(
        self,
        server: ServerProcess,
        prompts: PromptMaker,
        status_file: str | None = None,
        ssd_dir: str | None = None,
        disk: SmallDisk | None = None,
    ) -> None:
        try:
            server.wait_ready()
        except BaseException:  # interrupted, or it never came up: stop it, then say so
            server.stop(timeout_s=STOP_S)
            raise
        super().__init__(server.name, server.url, prompts)
        self.server = server
        self.miniflex = server.miniflex
        self.status_file = status_file
        self.ssd_dir = ssd_dir
        self.disk = disk or SmallDisk(0)  # never entered: no disk

    @property
    def rank_dir(self) -> str:
        assert self.ssd_dir is not None
        return rank_dirs([self.ssd_dir], 0)[0]

    def close(self) -> None:
        self.server.stop()
