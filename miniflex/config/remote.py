"""The remote tier's configuration keys: parsers, specs and cross-checks.

``miniflex.config`` merges :data:`REMOTE_SPECS` into its table of keys, so
every key here is set like any other (``kv_connector_extra_config`` or
``MINIFLEX_<KEY>``) and is listed in ``docs/config.md``. This module reads no
environment variable; it reads the password file named by
``remote_password_file``, once per :func:`read_password` call.

Credentials never go in ``remote_url``: vLLM logs its ``kv_transfer_config``,
so a password there would end up in logs. The password comes from
``remote_password`` (best set as ``MINIFLEX_REMOTE_PASSWORD``) or from
``remote_password_file``::

    MINIFLEX_REMOTE_URL=redis://cache.internal:6379 \\
    MINIFLEX_REMOTE_USER=miniflex MINIFLEX_REMOTE_PASSWORD_FILE=/run/secrets/redis
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from miniflex.config.mooncake_url import parse_mooncake_url
from miniflex.config.parse import parse_int, parse_seconds, parse_size
from miniflex.errors import ConfigError

__all__ = [
    "CLUSTER_SCHEMES",
    "MOONCAKE_SCHEME",
    "REMOTE_SCHEMES",
    "REMOTE_SPECS",
    "REMOTE_WRITES",
    "TLS_SCHEMES",
    "check_remote",
    "cluster_node_texts",
    "read_password",
    "tls_on",
]

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster", "valkey+cluster", "valkeys+cluster")
"""URL schemes of a Redis or Valkey Cluster, named by startup nodes ``HOST:PORT,...``."""
REMOTE_SCHEMES = ("redis", "rediss", "valkey", "valkeys", "unix", *CLUSTER_SCHEMES)
"""URL schemes of ``remote_url``: Redis or Valkey over TCP, TLS (``rediss``, ``valkeys``), a
Unix socket, or a cluster."""
MOONCAKE_SCHEME = "mooncake"
"""Mooncake Store by its master, ``mooncake://HOST[:PORT][?OPTIONS]``
(:mod:`miniflex.config.mooncake_url`)."""
TLS_SCHEMES = ("rediss", "valkeys", "rediss+cluster", "valkeys+cluster")
REMOTE_WRITES = ("through", "back", "off")
"""Values of ``remote_write``."""

_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_URL_HELP = (
    "expected redis://HOST[:PORT][/DB], rediss://... (TLS), valkey://, valkeys://, "
    "unix:///PATH or redis+cluster://HOST:PORT[,HOST:PORT...] (rediss+cluster for TLS), "
    "without credentials or options"
)
_NO_CREDENTIALS = (
    "credentials do not belong in the URL (vLLM logs its config): set remote_user and "
    "remote_password or remote_password_file"
)

Spec = tuple[Callable[[str, object], Any], Any, str, str]
"""``(parse, default, doc, shown default)``, wrapped by ``miniflex.config``."""


def _parse_url(key: str, value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(key, value, _URL_HELP)
    scheme = value.split("://", 1)[0] if "://" in value else ""
    if scheme == MOONCAKE_SCHEME:
        parse_mooncake_url(key, value)
        return value
    if scheme in CLUSTER_SCHEMES:
        if "@" in value:
            raise ConfigError(key, "<hidden>", _NO_CREDENTIALS)
        for node in cluster_node_texts(value):
            try:  # each startup node as one server's URL
                _parse_url(key, f"redis://{node}")
            except ConfigError:
                raise ConfigError(key, value, f"startup node {node!r} is not HOST:PORT") from None
            if "/" in node:
                raise ConfigError(key, value, "a cluster has no databases: drop the /DB")
        return value
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        raise ConfigError(
            key, value, _URL_HELP + " (the port must be a number from 1 to 65535)"
        ) from None
    if parts.scheme not in REMOTE_SCHEMES:
        raise ConfigError(key, value, _URL_HELP)
    if parts.username or parts.password:
        raise ConfigError(key, "<hidden>", _NO_CREDENTIALS)
    if parts.query or parts.fragment:
        raise ConfigError(key, value, "no URL options: use MiniFlex's remote_* keys instead")
    if parts.scheme == "unix":
        if not parts.path:
            raise ConfigError(key, value, "expected unix:///PATH/TO/SOCKET")
        return value
    if not parts.hostname or (port is not None and not 0 < port < 65536):
        raise ConfigError(key, value, _URL_HELP)
    if parts.path not in ("", "/") and not parts.path[1:].isdigit():
        raise ConfigError(key, value, "the path, if any, must be a database number, e.g. /0")
    return value


def cluster_node_texts(url: str) -> list[str]:
    """The startup nodes of a cluster URL as written, ``HOST[:PORT]`` each."""
    return [node.strip() for node in url.split("://", 1)[1].removesuffix("/").split(",")]


def _parse_text(key: str, value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(key, value, "expected a string")
    return value


def _parse_prefix(key: str, value: object) -> str:
    if not isinstance(value, str) or not _PREFIX_RE.match(value):
        raise ConfigError(key, value, "expected 1 to 64 letters, digits, '_', '.' or '-'")
    return value


def _parse_file(key: str, value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(key, value, "expected a file path")
    if not os.path.isfile(value) or not os.access(value, os.R_OK):
        raise ConfigError(key, value, "expected an existing file this process can read")
    return value


def _parse_bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(key, value, "expected true or false")


def _parse_write(key: str, value: object) -> str:
    if value not in REMOTE_WRITES:
        raise ConfigError(key, value, f"expected one of {', '.join(REMOTE_WRITES)}")
    return str(value)


def _parse_backlog(key: str, value: object) -> int:
    n = parse_size(key, value)
    if n <= 0:
        raise ConfigError(key, value, "expected a positive size such as '1GiB'")
    return n


def _parse_gbps(key: str, value: object) -> float | None:
    if value is None or value in ("", "auto"):
        return None
    try:
        x = float(value) if isinstance(value, (int, float, str)) and value is not True else None
    except ValueError:
        x = None
    if x is None or not x > 0:
        raise ConfigError(key, value, "expected 'auto' or a positive number of GB/s")
    return x


def _parse_streams(key: str, value: object) -> int | None:
    if value is None or value in ("", "auto"):
        return None
    return parse_int(key, value, 1, 64)


def read_password(path: str) -> str:
    """The password in ``path``: its text without the trailing newline; ConfigError if empty."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("remote_password_file", path, f"cannot be read: {exc}") from None
    if not text:
        raise ConfigError("remote_password_file", path, "the file is empty")
    return text


REMOTE_SPECS: dict[str, Spec] = {
    "remote_url": (
        _parse_url,
        None,
        "The shared remote tier's store: `redis://HOST:PORT[/DB]` (Redis or Valkey), "
        "`rediss://` for TLS, `unix:///PATH`, or a Redis or Valkey Cluster by its startup "
        "nodes, `redis+cluster://HOST:PORT[,HOST:PORT...]` (`rediss+cluster://` for TLS; "
        "chunks spread over its primaries by slot), or a Mooncake Store by its master, "
        "`mooncake://HOST[:PORT][?metadata=URL&protocol=auto|tcp|rdma]` "
        "(docs/design/remote-mooncake.md). Empty: no remote tier. Credentials go in "
        "`remote_user` and `remote_password` or `remote_password_file`, never in the URL. "
        "A local miss looks the store up; a hit is fetched into a CPU slot "
        "(docs/design/remote.md).",
        "",
    ),
    "remote_user": (
        _parse_text,
        None,
        "ACL user of the remote store. Empty: the `default` user (plain `requirepass`).",
        "",
    ),
    "remote_password": (
        _parse_text,
        None,
        "Password of the remote store; best set as `MINIFLEX_REMOTE_PASSWORD` (vLLM logs its "
        "`kv_transfer_config`). Empty: none, or `remote_password_file`'s.",
        "",
    ),
    "remote_password_file": (
        _parse_file,
        None,
        "File holding the remote store's password (its first line's trailing newline is "
        "dropped), e.g. a mounted secret. Not with `remote_password`.",
        "",
    ),
    "remote_prefix": (
        _parse_prefix,
        "miniflex",
        "First part of every key MiniFlex writes (`<prefix>:<namespace>:<chunk>`), so that "
        "an ACL can confine MiniFlex's user to `~<prefix>:*`.",
        "miniflex",
    ),
    "remote_tls": (
        _parse_bool,
        False,
        "Connect with TLS (also implied by a `rediss://` URL); the server's certificate is "
        "verified against `remote_tls_ca_file`, else the system's CAs.",
        "false",
    ),
    "remote_tls_ca_file": (
        _parse_file,
        None,
        "PEM file of the CA(s) that signed the remote store's certificate. Empty: the "
        "system's CAs.",
        "",
    ),
    "remote_tls_cert_file": (
        _parse_file,
        None,
        "PEM client certificate, for a server that authenticates clients "
        "(`tls-auth-clients yes`, Redis's default); with `remote_tls_key_file`.",
        "",
    ),
    "remote_tls_key_file": (
        _parse_file,
        None,
        "PEM private key of `remote_tls_cert_file`.",
        "",
    ),
    "remote_timeout_s": (
        lambda k, v: parse_seconds(k, v, 0.01, 60.0),
        1.0,
        "Bound on each connect, send and receive of a call to the remote store; a call "
        "that exceeds it fails (counted), it is never retried in place.",
        "1.0",
    ),
    "remote_write": (
        _parse_write,
        "through",
        "How chunks reach the remote store. `through`: every chunk stored in the CPU tier is "
        "also put to the store, asynchronously (a copy queued for a thread of its own), unless "
        "the store holds it already, so the fleet shares a prompt as soon as one replica "
        "computed it. `back`: a chunk is put when the CPU tier evicts it (copied before its "
        "slot is reused), so the store holds what this replica no longer does and a prompt "
        "is shared only once evicted. `off`: this replica only reads.",
        "through",
    ),
    "remote_write_backlog": (
        _parse_backlog,
        1 << 30,
        "Write-through: chunk copies waiting for their put, at most, per TP rank. A chunk "
        "stored while this much waits (a store slower than the engine's prefill, or one that "
        "is down) is not put, and counted; a prompt's head is queued before its tail, so the "
        "store keeps a prefix. The copy buffers are kept for reuse once put, so up to this "
        "much host memory stays allocated.",
        "1GiB",
    ),
    "remote_read_gbps": (
        _parse_gbps,
        None,
        "Cost model: remote store -> CPU pool fetch bandwidth in GB/s. `auto`: measured at "
        "start-up (each worker puts and fetches back one chunk), then learned from fetches.",
        "auto",
    ),
    "remote_fetch_streams": (
        _parse_streams,
        None,
        "Connections a load's remote fetches use at once, per TP rank; the chunks are dealt "
        "to them in turn, and each reads its share in pipelined windows of about 32 MiB "
        "straight into the CPU slots (one server; TLS and clusters fetch one chunk per call "
        "and connection). `auto`: a quarter of the host's CPUs, 1 to 4. More than 1 keeps "
        "fetches going beside vLLM's busy engine thread but costs a little on an idle "
        "2-core host (`python -m bench.remote_wire --streams 4`).",
        "auto",
    ),
    "remote_copy_threads": (
        lambda k, v: parse_int(k, v, 1, 32),
        4,
        "Write-through: threads per TP rank that copy stored chunks out of their CPU slots for "
        "their puts, each a group of 16 chunks at a time. A slot is stored into again only "
        "once its copy is made, and a copy into a buffer not used before waits on page "
        "faults, which overlap across threads (`python -m bench.fresh_copy --threads 4`).",
        "4",
    ),
    "remote_retry_s": (
        lambda k, v: parse_seconds(k, v, 0.0, 3600.0),
        1.0,
        "After a connection failure or timeout, calls fail at once (counted) for this "
        "long; then one call tries to reconnect.",
        "1.0",
    ),
}


def tls_on(url: str | None, tls: bool) -> bool:
    """TLS to the remote store: ``remote_tls``, or a ``rediss://`` / ``valkeys://`` URL."""
    return tls or urlsplit(url or "").scheme in TLS_SCHEMES


def check_remote(values: Mapping[str, Any]) -> None:
    """Raise ConfigError for remote settings that contradict each other or would be ignored."""
    if values.get("remote_password") and values.get("remote_password_file"):
        raise ConfigError(
            "remote_password_file",
            values["remote_password_file"],
            "remote_password is set too: set only one of them",
        )
    if values.get("remote_password_file"):
        read_password(values["remote_password_file"])  # an empty or unreadable file fails here
    if bool(values.get("remote_tls_cert_file")) != bool(values.get("remote_tls_key_file")):
        key = (
            "remote_tls_cert_file" if values.get("remote_tls_cert_file") else "remote_tls_key_file"
        )
        raise ConfigError(
            key, values[key], "set remote_tls_cert_file and remote_tls_key_file together"
        )
    for key in ("remote_tls_ca_file", "remote_tls_cert_file"):
        if values.get(key) and not tls_on(values.get("remote_url"), bool(values.get("remote_tls"))):
            raise ConfigError(
                key, values[key], "TLS is off: set remote_tls=true or use a rediss:// remote_url"
            )
    if str(values.get("remote_url") or "").startswith(MOONCAKE_SCHEME + "://"):
        for key in ("remote_user", "remote_password", "remote_password_file", "remote_tls"):
            if values.get(key):
                shown = "<hidden>" if key == "remote_password" else values[key]
                raise ConfigError(
                    key, shown, "Mooncake Store has no credentials or TLS: leave it unset"
                )
    if values.get("remote_url"):
        return
    for key in ("remote_user", "remote_password", "remote_password_file", "remote_tls"):
        if values.get(key):
            shown = "<hidden>" if key == "remote_password" else values[key]
            raise ConfigError(
                key, shown, "remote_url is empty, so it would be ignored: set remote_url"
            )
