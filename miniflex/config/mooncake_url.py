"""The ``mooncake://`` form of ``remote_url``: where a Mooncake Store's master is, and how to
reach its holders.

::

    mooncake://MASTER_HOST[:PORT][?metadata=URL][&protocol=auto|tcp|rdma]
        [&device=NAME[,NAME...]][&local_hostname=HOST]

- ``MASTER_HOST[:PORT]``: the ``mooncake_master``'s RPC address (port 50051 if left out).
- ``metadata``: the transfer engine's metadata service: ``http://HOST:PORT/metadata`` (the
  master's own, started with ``--enable_http_metadata_server=true``), ``etcd://HOST:PORT``,
  or ``P2PHANDSHAKE``. Default: ``http://MASTER_HOST:8080/metadata``, the master's HTTP
  metadata server on its default port.
- ``protocol``: how bytes move between this process and the holders' memory. ``auto``
  (the default): ``rdma`` where the host lists an RDMA device (``/sys/class/infiniband``),
  else ``tcp``.
- ``device``: RDMA device names (``rdma`` only); empty: Mooncake chooses.
- ``local_hostname``: the address this process gives the store's peers; default: this
  host's address on the route to the master.

The options are written in the URL, not in ``remote_*`` keys, because they say where the
store is, not how MiniFlex behaves; Mooncake Store has no credentials and no TLS.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from miniflex.errors import ConfigError

__all__ = ["MASTER_PORT", "METADATA_PORT", "SCHEME", "MooncakeTarget", "parse_mooncake_url"]

SCHEME = "mooncake"
MASTER_PORT = 50051
"""``mooncake_master``'s default ``--rpc_port``."""
METADATA_PORT = 8080
"""``mooncake_master``'s default ``--http_metadata_server_port``."""
PROTOCOLS = ("auto", "tcp", "rdma")
_OPTIONS = ("metadata", "protocol", "device", "local_hostname")
_HELP = (
    "expected mooncake://MASTER_HOST[:PORT][?metadata=http://HOST:PORT/metadata]"
    "[&protocol=auto|tcp|rdma][&device=NAME][&local_hostname=HOST]"
)


@dataclass(frozen=True)
class MooncakeTarget:
    """A parsed ``mooncake://`` URL; see the module docstring."""

    master_host: str
    master_port: int
    metadata: str
    protocol: str
    devices: str
    local_hostname: str | None

    @property
    def master(self) -> str:
        """``HOST:PORT`` of the master's RPC service, as Mooncake's client takes it."""
        return f"{self.master_host}:{self.master_port}"

    def transport(self) -> str:
        """``tcp`` or ``rdma``: the protocol, with ``auto`` resolved on this host."""
        if self.protocol != "auto":
            return self.protocol
        try:
            return "rdma" if os.listdir("/sys/class/infiniband") else "tcp"
        except OSError:
            return "tcp"

    def endpoints(self) -> list[tuple[str, int]]:
        """``(host, port)`` of the master's RPC service and, if HTTP, its metadata server:
        what a client set-up must reach first."""
        out = [(self.master_host, self.master_port)]
        meta = urlsplit(self.metadata)
        if meta.scheme in ("http", "https") and meta.hostname and meta.port:
            out.append((meta.hostname, meta.port))
        return out

    def hostname(self) -> str:
        """``local_hostname``, or this host's address on the route to the master."""
        if self.local_hostname:
            return self.local_hostname
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((self.master_host, self.master_port))  # no packet is sent
                return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def parse_mooncake_url(key: str, value: str) -> MooncakeTarget:
    """The target ``value`` names; ConfigError (naming ``key``) for anything else."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        raise ConfigError(key, value, _HELP + " (the port must be a number)") from None
    if parts.scheme != SCHEME or not parts.hostname:
        raise ConfigError(key, value, _HELP)
    if parts.username or parts.password:
        raise ConfigError(key, "<hidden>", "Mooncake Store has no credentials: drop them")
    if parts.path not in ("", "/") or parts.fragment:
        raise ConfigError(key, value, _HELP + " (no path)")
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise ConfigError(key, value, _HELP + " (options are NAME=VALUE joined by &)") from None
    for name, values in query.items():
        if name not in _OPTIONS:
            expected = ", ".join(_OPTIONS)
            raise ConfigError(key, value, f"unknown option {name!r}: expected {expected}")
        if len(values) != 1:
            raise ConfigError(key, value, f"option {name!r} is given {len(values)} times")
    options = {name: values[0] for name, values in query.items()}
    host = parts.hostname
    metadata = options.get("metadata") or f"http://{_bracketed(host)}:{METADATA_PORT}/metadata"
    _check_metadata(key, value, metadata)
    protocol = options.get("protocol") or "auto"
    if protocol not in PROTOCOLS:
        raise ConfigError(key, value, f"protocol {protocol!r}: expected one of {PROTOCOLS}")
    if options.get("device") and protocol == "tcp":
        raise ConfigError(key, value, "device names an RDMA device: not with protocol=tcp")
    return MooncakeTarget(
        master_host=host,
        master_port=MASTER_PORT if port is None else port,
        metadata=metadata,
        protocol=protocol,
        devices=options.get("device", ""),
        local_hostname=options.get("local_hostname") or None,
    )


def _check_metadata(key: str, value: str, metadata: str) -> None:
    if metadata == "P2PHANDSHAKE":
        return
    try:
        meta = urlsplit(metadata)
        meta_port = meta.port
    except ValueError:
        meta, meta_port = None, None
    if meta is None or meta.scheme not in ("http", "https", "etcd") or not meta.hostname:
        raise ConfigError(
            key,
            value,
            f"metadata={metadata!r}: expected http://HOST:PORT/metadata, etcd://HOST:PORT "
            "or P2PHANDSHAKE (write it URL-encoded if it has & or =)",
        )
    if meta.scheme != "etcd" and meta_port is None:
        raise ConfigError(key, value, f"metadata={metadata!r}: give its port")


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
