"""A private Mooncake Store on free local ports, for tests and demos: a ``mooncake_master``
(with its HTTP metadata server, no etcd) and one holder, ``mooncake_client``, that mounts
``segment_bytes`` of its memory for the store's values. Both are the wheel's own binaries,
run as child processes with their logs in ``directory``::

    with LocalMooncake(tmp_dir) as store:
        url = store.url                          # mooncake://127.0.0.1:<port>?metadata=...
        store.kill_holder(); store.start_holder()    # a holder crash and a restart
        store.pause_master(); store.resume_master()  # a hung master (SIGSTOP / SIGCONT)

Operators run their own master and holders; this is not how MiniFlex reaches them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from miniflex.errors import MiniFlexError
from miniflex.remote.local_server import free_port

__all__ = ["LocalMooncake", "mooncake_missing"]

_START_TIMEOUT_S = 30.0


def mooncake_missing() -> str | None:
    """Why Mooncake's client cannot be used here (with the fix), or None if it can."""
    try:
        import mooncake.store  # noqa: F401
    except ImportError as exc:
        return (
            f"Mooncake's client does not import ({exc}): pip install -e '.[mooncake]' and "
            "apt-get install libibverbs1 (scripts/test.sh does both)"
        )
    return None


class LocalMooncake:
    """A master and one holder on ``127.0.0.1``; see the module docstring."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        segment_bytes: int = 512 << 20,
        client_ttl_s: int = 2,
    ) -> None:
        """``client_ttl_s``: how long the master keeps a silent holder's segment (the
        master's ``--client_ttl``; its default, 10 s, makes a dead holder's values linger)."""
        import mooncake

        self._bin = Path(mooncake.__file__).parent
        self._dir = Path(directory)
        self._dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.client_ttl_s = client_ttl_s
        self.master_port, self.metadata_port = free_port(), free_port()
        self._metrics_port, self._holder_port = free_port(), free_port()
        self._master: subprocess.Popen[bytes] | None = None
        self._holder: subprocess.Popen[bytes] | None = None

    @property
    def metadata_url(self) -> str:
        return f"http://127.0.0.1:{self.metadata_port}/metadata"

    @property
    def url(self) -> str:
        return f"mooncake://127.0.0.1:{self.master_port}?metadata={self.metadata_url}&protocol=tcp"

    def start(self) -> LocalMooncake:
        """Start the master, then the holder; return once the holder's memory is mounted."""
        return self.start_master().start_holder()

    def start_master(self) -> LocalMooncake:
        """Start the master (empty: it keeps nothing across a restart); wait until it serves."""
        assert self._master is None, "the master is running"
        self._master = self._spawn(
            "master",
            "mooncake_master",
            f"-rpc_port={self.master_port}",
            "-enable_http_metadata_server=true",
            "-http_metadata_server_host=127.0.0.1",
            f"-http_metadata_server_port={self.metadata_port}",
            f"-metrics_port={self._metrics_port}",
            f"-client_ttl={self.client_ttl_s}",
        )
        for port in (self.master_port, self.metadata_port, self._metrics_port):
            self._wait("master", lambda p=port: _listening(p))
        if self._holder is not None:  # a restarted master: the holder mounts again
            self.wait_mounted()
        return self

    def start_holder(self) -> LocalMooncake:
        """Start the holder; wait until the master counts its memory."""
        assert self._holder is None, "the holder is running"
        self._holder = self._spawn(
            "holder",
            "mooncake_client",
            "-host=127.0.0.1",
            f"-port={self._holder_port}",
            f"-global_segment_size={self.segment_bytes}",
            f"-master_server_address=127.0.0.1:{self.master_port}",
            f"-metadata_server={self.metadata_url}",
            "-protocol=tcp",
        )
        self.wait_mounted()
        return self

    def wait_mounted(self) -> None:
        """Wait until the master counts at least the holder's memory (it mounts again by
        itself after a master restart)."""
        self._wait("holder", lambda: self.capacity() >= self.segment_bytes)

    def capacity(self) -> int:
        """Bytes of holder memory the master counts now (0 if it does not answer)."""
        return max(0, self._metric("master_total_capacity_bytes"))

    def key_count(self) -> int:
        """Keys the master holds now (-1 if it does not answer)."""
        return self._metric("master_key_count")

    def _metric(self, name: str) -> int:
        """The master's Prometheus metric ``name``; -1 if it does not answer or lacks it."""
        try:
            url = f"http://127.0.0.1:{self._metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=1) as reply:
                text = reply.read().decode()
        except OSError:
            return -1
        for line in text.splitlines():
            if line.startswith(f"{name} "):
                return int(float(line.split()[1]))
        return -1

    def kill_master(self) -> None:
        self._master = _kill(self._master)

    def kill_holder(self) -> None:
        self._holder = _kill(self._holder)

    def pause_master(self) -> None:
        """SIGSTOP: connections stay open and every call to the master hangs."""
        assert self._master is not None
        _stop(self._master.pid)

    def resume_master(self) -> None:
        assert self._master is not None
        os.kill(self._master.pid, signal.SIGCONT)

    def pause_holder(self) -> None:
        """SIGSTOP: the master still lists the holder's memory, but no byte moves."""
        assert self._holder is not None
        _stop(self._holder.pid)

    def resume_holder(self) -> None:
        assert self._holder is not None
        os.kill(self._holder.pid, signal.SIGCONT)

    def kill(self) -> None:
        self.kill_holder()
        self.kill_master()

    def __enter__(self) -> LocalMooncake:
        try:
            return self.start()
        except BaseException:
            self.kill()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()

    def _spawn(self, role: str, binary: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self._dir / f"{role}.log", "ab")  # noqa: SIM115 (the child keeps it)
        proc = subprocess.Popen([str(self._bin / binary), *args], stdout=log, stderr=log)
        log.close()
        return proc

    def _wait(self, role: str, ready: Callable[[], bool]) -> None:
        proc = self._master if role == "master" else self._holder
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                break
            if ready():
                return
            time.sleep(0.05)
        tail = (self._dir / f"{role}.log").read_text(errors="replace")[-2000:]
        raise MiniFlexError(f"the Mooncake {role} did not start:\n{tail}")


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def _kill(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL ``proc`` (paused or not) and reap it."""
    if proc is not None:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait()
    return None


def _stop(pid: int, wait_s: float = 5.0) -> None:
    """SIGSTOP ``pid`` and return once every thread of it is stopped: the signal is
    delivered asynchronously, and a thread running on another CPU may otherwise answer
    one more request after ``kill`` returned."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
            states = [
                Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0]
                for t in tasks
            ]
        except OSError:  # no /proc (not Linux), or the process is gone
            return
        if all(state in ("T", "t") for state in states):
            return
        time.sleep(0.001)
