"""A private ``redis-server`` (or ``valkey-server``) on a free local port, for tests and demos.

It runs in the foreground as a child process, with no persistence, an
``allkeys-lru`` memory cap, and its configuration (password, ACL users, TLS)
written to a file in its own directory, so no secret is on a command line::

    with LocalServer(tmp_dir, password="s3cret") as server:
        url = server.url                 # redis://127.0.0.1:<port>
        server.kill(); server.start()    # a crash and a restart on the same port
        server.pause(); server.resume()  # a hung server (SIGSTOP / SIGCONT)

    with LocalCluster(tmp_dir, nodes=3) as cluster:   # a Redis Cluster of three primaries
        url = cluster.url                # redis+cluster://127.0.0.1:<port>,...

Operators run their own store; this is not how MiniFlex reaches one.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from miniflex.errors import MiniFlexError

__all__ = [
    "SERVER_BINARIES",
    "LocalCluster",
    "LocalServer",
    "ServerTLS",
    "free_port",
    "server_binary",
]

SERVER_BINARIES = ("redis-server", "valkey-server")
"""The servers a :class:`LocalServer` can run, the default first."""
_START_TIMEOUT_S = 10.0


def server_binary(name: str | None = None) -> str | None:
    """The path of ``name`` (one of :data:`SERVER_BINARIES`), or of the first of them
    installed; None if it is not installed."""
    for candidate in SERVER_BINARIES if name is None else (name,):
        path = shutil.which(candidate)
        if path is not None:
            return path
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class ServerTLS:
    """PEM files of a TLS server; ``ca_file`` also verifies clients when ``auth_clients``."""

    cert_file: str
    key_file: str
    ca_file: str
    auth_clients: bool = False


class LocalServer:
    """One server process on ``127.0.0.1:port``; see the module docstring."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        password: str | None = None,
        acl_users: Sequence[str] = (),
        tls: ServerTLS | None = None,
        maxmemory: str = "1gb",
        port: int | None = None,
        cluster: bool = False,
        io_threads: int = 1,
        binary: str | None = None,
    ) -> None:
        """``cluster``: a Redis Cluster node (its slots assigned by :class:`LocalCluster`);
        ``io_threads``: the server's I/O threads (``io-threads``, reads too; 1: none);
        ``binary``: ``redis-server`` or ``valkey-server`` (None: whichever is installed)."""
        assert binary is None or binary in SERVER_BINARIES, binary
        path = server_binary(binary)
        if path is None:
            raise MiniFlexError(
                f"{binary or 'neither redis-server nor valkey-server'} is not installed"
            )
        binary = path
        self.binary = binary
        self.port = free_port() if port is None else port
        self.cluster_port = free_port() if cluster else None  # not port + 10000: may be taken
        self.tls = tls
        self._dir = Path(directory)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._conf = self._dir / "server.conf"
        text = _conf_text(self.port, password, acl_users, tls, maxmemory)
        if io_threads > 1:
            text += f"io-threads {io_threads}\nio-threads-do-reads yes\n"
        if cluster:
            text += "cluster-enabled yes\ncluster-config-file nodes.conf\n"
            text += f"cluster-node-timeout 2000\ncluster-port {self.cluster_port}\n"
        self._conf.write_text(f"dir {self._dir.resolve()}\n" + text)
        self._conf.chmod(0o600)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}"

    def start(self) -> LocalServer:
        """Start the server and wait until it accepts connections."""
        assert self._proc is None or self._proc.poll() is not None, "already running"
        log = open(self._dir / "server.log", "ab")  # noqa: SIM115 (the child keeps it)
        self._proc = subprocess.Popen([self.binary, str(self._conf)], stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.02)
        tail = (self._dir / "server.log").read_text(errors="replace")[-2000:]
        self.kill()
        raise MiniFlexError(f"{self.binary} did not start on port {self.port}:\n{tail}")

    def kill(self) -> None:
        """SIGKILL the server (no shutdown, no save) and reap it; a no-op if it is not running."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGCONT)  # a paused process dies on SIGKILL too
            self._proc.kill()
        self._proc.wait()
        self._proc = None

    def pause(self) -> None:
        """SIGSTOP: connections stay open and every call hangs, like an overloaded server."""
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGCONT)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()


def _conf_text(
    port: int,
    password: str | None,
    acl_users: Sequence[str],
    tls: ServerTLS | None,
    maxmemory: str,
) -> str:
    lines = [
        "bind 127.0.0.1",
        'save ""',
        "appendonly no",
        f"maxmemory {maxmemory}",
        "maxmemory-policy allkeys-lru",
    ]
    if tls is None:
        lines.append(f"port {port}")
    else:
        lines += [
            "port 0",
            f"tls-port {port}",
            f"tls-cert-file {tls.cert_file}",
            f"tls-key-file {tls.key_file}",
            f"tls-ca-cert-file {tls.ca_file}",
            f"tls-auth-clients {'yes' if tls.auth_clients else 'no'}",
        ]
    if password is not None:
        lines.append(f"requirepass {password}")
    lines += [f"user {rule}" for rule in acl_users]
    return "\n".join(lines) + "\n"


class LocalCluster:
    """``nodes`` cluster-enabled servers, the 16384 hash slots split among them, no replicas."""

    SLOTS = 16384

    def __init__(
        self, directory: str | os.PathLike[str], nodes: int = 3, **options: object
    ) -> None:
        """``options``: those of :class:`LocalServer` (``password``, ``maxmemory``...)."""
        root = Path(directory)
        self.servers = [
            LocalServer(root / f"node{i}", cluster=True, **options)  # type: ignore[arg-type]
            for i in range(nodes)
        ]
        self._password = options.get("password")

    @property
    def url(self) -> str:
        scheme = "rediss+cluster" if self.servers[0].tls else "redis+cluster"
        return f"{scheme}://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers)

    def start(self) -> LocalCluster:
        """Start every node, assign the slots, introduce the nodes; wait for cluster_state ok."""
        import redis

        for server in self.servers:
            server.start()
        clients = [
            redis.Redis(
                port=s.port,
                password=self._password,  # type: ignore[arg-type]
                socket_timeout=5,
            )
            for s in self.servers
        ]
        share = -(-self.SLOTS // len(clients))
        for i, client in enumerate(clients):
            first, last = i * share, min(self.SLOTS, (i + 1) * share) - 1
            client.execute_command("CLUSTER ADDSLOTSRANGE", first, last)
            if i:
                first_node = self.servers[0]
                client.execute_command(
                    "CLUSTER MEET", "127.0.0.1", first_node.port, first_node.cluster_port
                )
        deadline = time.monotonic() + _START_TIMEOUT_S * 3
        while time.monotonic() < deadline:
            states = [c.execute_command("CLUSTER INFO") for c in clients]
            if all(_cluster_ok(s) for s in states):
                break
            time.sleep(0.1)
        else:
            self.kill()
            raise MiniFlexError("the local cluster did not reach cluster_state:ok")
        for client in clients:
            client.close()
        return self

    def kill(self) -> None:
        for server in self.servers:
            server.kill()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


def private_store(
    directory: str | os.PathLike[str], primaries: int = 0, **options: object
) -> LocalServer | LocalCluster:
    """A store for one benchmark or test, not started: one server (``primaries`` 0), or a
    cluster of that many primaries (``options`` as :class:`LocalServer`'s, per primary)."""
    if primaries:
        return LocalCluster(directory, nodes=primaries, **options)
    return LocalServer(directory, **options)  # type: ignore[arg-type]


def _cluster_ok(info: object) -> bool:
    """Whether a ``CLUSTER INFO`` reply (parsed by the client into a dict, or raw) says ok."""
    if isinstance(info, dict):
        return str(info.get("cluster_state")) == "ok"
    return b"cluster_state:ok" in (info if isinstance(info, bytes) else str(info).encode())
