"""``miniflex serve``: the vllm command line it builds, and stale socket clean-up."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from miniflex.connector.serve import build_serve_argv, remove_stale_sockets
from miniflex.errors import ConfigError


def test_model_and_port_come_from_the_environment() -> None:
    argv = build_serve_argv(["--dtype", "bfloat16"], {"MODEL": "/m", "PORT": "9001"})
    assert "/m" in argv and argv[argv.index("--port") + 1] == "9001"
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv["kv_connector"] == "MiniFlexConnector"
    assert kv["kv_connector_module_path"] == "miniflex.connector"
    assert kv["kv_load_failure_policy"] == "recompute"


def test_command_line_model_and_port_win() -> None:
    argv = build_serve_argv(["/cli-model", "--port", "7"], {"MODEL": "/env", "PORT": "9"})
    assert "/cli-model" in argv and "/env" not in argv and argv.count("--port") == 1


def test_missing_model_and_bad_config_fail_before_vllm_starts() -> None:
    with pytest.raises(ConfigError, match="MODEL"):
        build_serve_argv([], {})
    with pytest.raises(ConfigError, match="cpu_bytes"):
        build_serve_argv(["/m"], {"MINIFLEX_CPU_BYTES": "lots"})
    with pytest.raises(ConfigError, match="kv-transfer-config"):
        build_serve_argv(["/m", "--kv-transfer-config", "{}"], {})


def test_only_sockets_nobody_listens_on_are_removed(tmp_path: Path) -> None:
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(tmp_path / "live"))
    live.listen()
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(tmp_path / "dead"))
    dead.close()  # the file stays behind, like after a crash
    (tmp_path / "plain-file").write_text("not a socket")
    try:
        assert remove_stale_sockets(tmp_path) == [tmp_path / "dead"]
        assert (tmp_path / "live").exists() and (tmp_path / "plain-file").exists()
    finally:
        live.close()
