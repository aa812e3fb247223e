"""``miniflex serve``: ``vllm serve`` with the MiniFlex connector configured.

    MODEL=/models/qwen3-8b PORT=8000 MINIFLEX_CPU_BYTES=32GiB miniflex serve [vllm serve args]

``MODEL`` is used when no model is given on the command line, ``PORT`` when no
``--port`` is. ``MINIFLEX_*`` variables are validated here, before vLLM starts,
and reach the connector in every vLLM process through the environment. Stale
IPC sockets that a crashed server left in the temp directory are removed first.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from miniflex.config import MiniFlexConfig, serve_environment, serve_settings
from miniflex.connector import compat
from miniflex.errors import ConfigError

__all__ = ["build_serve_argv", "remove_stale_sockets"]

logger = logging.getLogger("miniflex.serve")

KV_TRANSFER = {
    "kv_connector": "MiniFlexConnector",
    "kv_connector_module_path": "miniflex.connector",
    "kv_role": "kv_both",
    "kv_load_failure_policy": "recompute",
}


def build_serve_argv(args: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """The ``vllm serve`` command line for ``miniflex serve ARGS`` (validates the config)."""
    MiniFlexConfig.from_dict({}, env=env)  # fail fast, with MiniFlex's own error message
    model, port = serve_settings(env)
    args = list(args)
    if "--kv-transfer-config" in args or any(a.startswith("--kv-transfer-config=") for a in args):
        raise ConfigError("--kv-transfer-config", "given", "leave it out: miniflex serve sets it")
    if args and not args[0].startswith("-"):
        model = args.pop(0)
    if not model:
        raise ConfigError("MODEL", None, "give a model as the first argument or in $MODEL")
    if port and not any(a == "--port" or a.startswith("--port=") for a in args):
        args += ["--port", port]
    return compat.serve_command(model, [*args, "--kv-transfer-config", json.dumps(KV_TRANSFER)])


def remove_stale_sockets(directory: str | Path | None = None) -> list[Path]:
    """Unlink unix sockets in ``directory`` that nobody listens on any more."""
    removed = []
    for path in Path(directory or tempfile.gettempdir()).iterdir():
        try:
            if not stat.S_ISSOCK(path.lstat().st_mode) or path.owner() != _me():
                continue
        except (OSError, KeyError):
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(str(path))
            except ConnectionRefusedError:
                path.unlink(missing_ok=True)
                removed.append(path)
            except OSError:
                continue
    return removed


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def serve(args: Sequence[str]) -> int:
    argv = build_serve_argv(args)
    for path in remove_stale_sockets():
        logger.info("removed stale IPC socket %s", path)
    print("[miniflex serve] " + " ".join(argv[1:]), file=sys.stderr, flush=True)
    os.execve(argv[0], argv, serve_environment())
    return 0  # not reached
