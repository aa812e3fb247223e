"""``miniflex serve``: ``vllm serve`` with the MiniFlex connector configured.

    MODEL=/models/qwen3-8b PORT=8000 MINIFLEX_CPU_BYTES=32GiB miniflex serve [vllm serve args]

``MODEL`` is used when no model is given on the command line, ``PORT`` when no
``--port`` is. Before vLLM starts, the ``MINIFLEX_*`` settings are validated and
checked against the model and the machine (``connector/preflight.py``): a bad
one ends the command with one line naming the setting, its value and the fix,
and nothing is left behind. The settings reach the connector in every vLLM
process through the environment. Stale IPC sockets that a crashed server left
in the temp directory are removed first. A request with prompt token ids outside
the model's vocabulary is answered 400 (``connector/token_guard.py``). On
SIGTERM the engine finishes what is in flight for ``--shutdown-timeout`` seconds
(:data:`~miniflex.connector.shutdown_guard.DRAIN_S` unless given), and whatever
it did not finish is answered 503 (``connector/shutdown_guard.py``).
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
from miniflex.connector.preflight import EngineArgs, check_before_start
from miniflex.connector.shutdown_guard import DRAIN_S
from miniflex.errors import ConfigError

__all__ = ["build_serve_argv", "check_settings", "remove_stale_sockets"]

logger = logging.getLogger("miniflex.serve")

TOKEN_GUARD = "miniflex.connector.token_guard.TokenIdGuard"
SHUTDOWN_GUARD = "miniflex.connector.shutdown_guard.ShutdownGuard"

KV_TRANSFER = {
    "kv_connector": "MiniFlexConnector",
    "kv_connector_module_path": "miniflex.connector",
    "kv_role": "kv_both",
    "kv_load_failure_policy": "recompute",
}


def build_serve_argv(args: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """The ``vllm serve`` command line for ``miniflex serve ARGS`` (validates the config)."""
    MiniFlexConfig.from_dict({}, env=env)  # fail fast, with MiniFlex's own error message
    model, args = _model_and_args(args, env)
    _, port = serve_settings(env)
    if "--kv-transfer-config" in args or any(a.startswith("--kv-transfer-config=") for a in args):
        raise ConfigError("--kv-transfer-config", "given", "leave it out: miniflex serve sets it")
    if port and not any(a == "--port" or a.startswith("--port=") for a in args):
        args += ["--port", port]
    # Out-of-vocabulary token ids get a 400 instead of killing the engine (token_guard.py);
    # requests the engine stopped before finishing get a 503, not a hang (shutdown_guard.py).
    args += ["--middleware", TOKEN_GUARD, "--middleware", SHUTDOWN_GUARD]
    given = any(a == "--shutdown-timeout" or a.startswith("--shutdown-timeout=") for a in args)
    if not given and compat.engine_arg_known("shutdown_timeout"):
        args += ["--shutdown-timeout", str(DRAIN_S)]
    if not any("hybrid-kv-cache-manager" in a for a in args):
        # MiniFlex keeps one KV group; saying so spares the user vLLM's warning about it.
        args.append("--disable-hybrid-kv-cache-manager")
    return compat.serve_command(model, [*args, "--kv-transfer-config", json.dumps(KV_TRANSFER)])


def check_settings(args: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """Check the settings against the model and the machine, before vLLM starts.

    Raises ConfigError for the first that cannot work; returns one line per
    thing checked, for the start-up report.
    """
    config = MiniFlexConfig.from_dict({}, env=env)
    model, rest = _model_and_args(args, env)
    return check_before_start(model, config, EngineArgs.from_cli(rest))


def _model_and_args(args: Sequence[str], env: Mapping[str, str] | None) -> tuple[str, list[str]]:
    """The model (first argument, ``--model``, else ``$MODEL``) and the other arguments."""
    args = list(args)
    model, _ = serve_settings(env)
    if args and not args[0].startswith("-"):
        model = args.pop(0)
    for i, a in enumerate(args):
        if a == "--model" and i + 1 < len(args):
            model = args[i + 1]
            del args[i : i + 2]
            break
        if a.startswith("--model="):
            model = a.split("=", 1)[1]
            del args[i]
            break
    if not model:
        raise ConfigError("MODEL", None, "give a model as the first argument or in $MODEL")
    return model, args


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
    for line in check_settings(args):
        print(f"[miniflex serve] {line}", file=sys.stderr, flush=True)
    for path in remove_stale_sockets():
        logger.info("removed stale IPC socket %s", path)
    shown = [a for a in argv[1:] if not a.startswith("-W")]  # vLLM's own command line
    print("[miniflex serve] " + " ".join(shown), file=sys.stderr, flush=True)
    os.execve(argv[0], argv, serve_environment())
    return 0  # not reached
