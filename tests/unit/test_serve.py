"""``miniflex serve``: the vllm command line it builds, and stale socket clean-up."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from miniflex.errors import ConfigError
from miniflex.tools.serve import build_serve_argv, remove_stale_sockets


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


def test_model_may_be_given_as_an_option_too() -> None:
    argv = build_serve_argv(["--model", "/opt-model", "--dtype", "bfloat16"], {"MODEL": "/env"})
    assert argv.count("/opt-model") == 1 and "/env" not in argv


def test_vllm_notices_about_what_miniflex_chose_are_left_out() -> None:
    """The hybrid KV cache manager is off (MiniFlex keeps one KV group) and, where vLLM
    runs as the api_server module, that module's own deprecation notices are filtered."""
    argv = build_serve_argv(["/m"], {})
    assert argv.count("--disable-hybrid-kv-cache-manager") == 1
    if "vllm.entrypoints.openai.api_server" in argv:
        assert argv[1].startswith("-Wignore:`vllm.entrypoints.openai.api_server`")
    mine = build_serve_argv(["/m", "--no-disable-hybrid-kv-cache-manager"], {})
    assert "--disable-hybrid-kv-cache-manager" not in mine
