"""A vLLM server this process starts and owns: ``miniflex serve`` or plain vLLM, on a port.

Used by the soak (``miniflex bench soak``) and its CI test, which need what a
server someone else runs cannot give: a ``kill -9`` and a restart on the same
SSD directory, the server's memory (RSS) across rounds, its log.

The server runs in a process group of its own, so :meth:`ServerProcess.kill`
takes the API server, the engine core and the workers down together, as a
crash or a power cut would.

Example::

    srv = ServerProcess.start("miniflex", model, ["--dtype", "float32"], env, log_dir)
    srv.wait_ready()
    ...
    srv.kill()                      # SIGKILL to every process of the server
    srv = srv.restart()             # same command, same environment, same SSD directory
    srv.stop()
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from miniflex.errors import MiniFlexError
from miniflex.remote.local_server import free_port

__all__ = ["ServerProcess", "free_port"]

START_TIMEOUT_S = 600.0


@dataclass
class ServerProcess:
    """One server: ``miniflex serve MODEL ARGS`` (``miniflex=True``) or plain vLLM."""

    name: str
    model: str
    args: tuple[str, ...]
    env: dict[str, str]
    log_path: Path
    miniflex: bool
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    _log: IO[bytes] | None = None

    @classmethod
    def start(
        cls,
        name: str,
        model: str,
        args: Sequence[str],
        env: Mapping[str, str],
        log_dir: Path,
        miniflex: bool = True,
    ) -> ServerProcess:
        srv = cls(name, model, tuple(args), dict(env), Path(log_dir) / f"{name}.log", miniflex)
        srv._spawn()
        return srv

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        common = ["--host", "127.0.0.1", "--port", str(self.port), *self.args]
        if self.miniflex:
            return [sys.executable, "-m", "miniflex.tools.cli", "serve", self.model, *common]
        from miniflex.connector.compat import serve_command

        return serve_command(self.model, common)

    def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log.write(f"\n==== start {self.starts + 1} of {self.name}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(
            self._command(),
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.starts += 1

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Wait until ``/health`` answers; seconds it took. MiniFlexError if it exits first."""
        t0 = time.monotonic()
        while True:
            if not self.alive():
                raise MiniFlexError(f"{self.name} exited while starting; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except (OSError, http.client.HTTPException):  # not up yet, or mid-start
                pass
            if time.monotonic() - t0 > timeout_s:
                raise MiniFlexError(f"{self.name} not healthy after {timeout_s:.0f} s")
            time.sleep(0.5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pids(self) -> list[int]:
        """Every live process of the server (its process group)."""
        if self.proc is None:
            return []
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.getpgid(int(entry)) == self.proc.pid:
                        out.append(int(entry))
                except OSError:
                    continue
        return out

    def rss_bytes(self) -> int:
        """Proportional set size of all its processes (shared pages counted once in total)."""
        return sum(self.pss_by_process().values())

    def pss_by_process(self) -> dict[str, int]:
        """PSS bytes per process name (``/proc/PID/comm``: the API server, the engine core,
        the workers), processes of the same name summed."""
        out: dict[str, int] = {}
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    name = f.read().strip()
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    pss = next(int(ln.split()[1]) for ln in f if ln.startswith("Pss:"))
            except (OSError, StopIteration):
                continue
            out[name] = out.get(name, 0) + pss * 1024
        return out

    def kill(self) -> None:
        """``kill -9`` of every process of the server at once; waits until they are gone."""
        if self.proc is None:
            return
        pids = self.pids()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + 30
        while any(_exists(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._close_log()

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM to the server; SIGKILL if it has not exited after ``timeout_s``."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        self._close_log()

    def restart(self) -> ServerProcess:
        """Start the same command again (after :meth:`kill` or :meth:`stop`); same port."""
        assert not self.alive(), "restart of a running server"
        self._spawn()
        return self

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            return r.read().decode()

    def model_id(self) -> str:
        with urllib.request.urlopen(self.url + "/v1/models", timeout=30) as r:
            return str(json.loads(r.read())["data"][0]["id"])

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def _exists(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited but not reaped yet, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False
