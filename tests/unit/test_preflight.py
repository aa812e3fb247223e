"""Settings checked against the model and the machine before vLLM starts (serve, make_llm)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from miniflex.config import MiniFlexConfig
from miniflex.connector.preflight import EngineArgs, check_before_start, check_model
from miniflex.errors import ConfigError
from miniflex.tools.serve import check_settings
from tests.conftest import MountFS

# The generated tiny model's shape: 4 layers x 2 KV heads x 64, bf16 -> 2 KiB of KV per token.
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 4,
    "vocab_size": 2048,
    "torch_dtype": "bfloat16",
}
KIB = 1024


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(TINY))
    return path


def config(**settings: object) -> MiniFlexConfig:
    return MiniFlexConfig.from_dict(settings, env={})


def refused(model: Path | str, cfg: MiniFlexConfig, *vllm_args: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        check_before_start(str(model), cfg, EngineArgs.from_cli(vllm_args))
    assert "\n" not in str(info.value)
    return info.value


def test_a_missing_model_path_is_named_with_the_fix() -> None:
    err = refused("/nonexistent/model", config())
    assert err.key == "model" and err.value == "/nonexistent/model"
    assert "no such directory" in str(err) and "repo id such as" in str(err)


def test_a_directory_without_config_json_is_not_a_model(tmp_path: Path) -> None:
    err = refused(tmp_path, config())
    assert "has no config.json" in str(err)


class FakeHub(BaseHTTPRequestHandler):
    """The Hub's model API: ``known-org/known-model`` exists, every other repo does not."""

    def do_GET(self) -> None:
        if self.path.startswith("/api/models/known-org/known-model"):
            body = json.dumps({"id": "known-org/known-model", "sha": "0" * 40}).encode()
            self.send_response(200)
        else:
            body = b'{"error": "Repository not found"}'
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """HF_ENDPOINT at a local fake Hub, online."""
    from huggingface_hub import constants

    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield url
    server.shutdown()
    server.server_close()


def test_a_repo_id_the_hub_has_is_left_to_vllm(hub: str) -> None:
    lines = check_before_start("known-org/known-model", config(), EngineArgs())
    assert "not known here" in lines[0]
    assert check_model("known-org/known-model") is None


def test_a_repo_id_neither_here_nor_on_the_hub_is_refused(hub: str) -> None:
    err = refused("mdoel/tiny", config())
    assert err.key == "model" and err.value == "mdoel/tiny"
    assert "no such local directory" in str(err) and "the Hub has no such repo" in str(err)


def test_an_unreachable_hub_is_refused_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    err = refused("some-org/some-model", config())
    assert "cannot be reached" in str(err) and f"127.0.0.1:{port}" in str(err)


def test_offline_a_repo_id_not_cached_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    err = refused("mdoel/tiny", config())
    assert "HF_HUB_OFFLINE is set" in str(err)


@pytest.mark.parametrize(
    ("vllm_args", "chunk_kib", "ranks"),
    [
        ((), 128, 1),  # no --block-size: the smallest default (16), 4 blocks -> 64 tokens
        (("--block-size", "32"), 128, 1),  # 2 blocks of 32
        (("--block-size", "128"), 256, 1),  # 1 block of 128
        (("--block-size", "32", "-tp", "2"), 64, 2),  # one KV head per rank, a pool per rank
        (("--block-size", "32", "--kv-cache-dtype", "fp8"), 64, 1),
        (("--block-size", "32", "--dtype", "float32"), 256, 1),
    ],
)
def test_cpu_bytes_must_hold_one_chunk_of_this_model(
    model: Path, vllm_args: tuple[str, ...], chunk_kib: int, ranks: int
) -> None:
    """``cpu_bytes`` is the engine's: with TP each rank's pool must hold a chunk of its own."""
    need = chunk_kib * ranks
    err = refused(model, config(cpu_bytes=need * KIB - 4096), *vllm_args)
    assert err.key == "cpu_bytes"
    assert f"is {chunk_kib}" in str(err) and f"to at least {need}" in str(err)
    lines = check_before_start(
        str(model), config(cpu_bytes=need * KIB), EngineArgs.from_cli(vllm_args)
    )
    assert "holds 1 of them" in lines[0]


MLA = TINY | {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
}


@pytest.mark.parametrize("tp", ["1", "2"])
def test_an_mla_chunk_is_one_latent_vector_a_token_in_one_pool(tmp_path: Path, tp: str) -> None:
    """An MLA model caches 512 + 64 values a token and layer, the same on every TP rank, in
    one pool: 64 tokens x 4 layers x 1,152 bytes = 288 KiB per engine, whatever the TP size."""
    (tmp_path / "config.json").write_text(json.dumps(MLA))
    args = ("--block-size", "32", "-tp", tp)
    err = refused(tmp_path, config(cpu_bytes=288 * KIB - 4096), *args)
    assert "1 KV heads of 576" in str(err) and "to at least 288" in str(err)
    lines = check_before_start(
        str(tmp_path), config(cpu_bytes=288 * KIB), EngineArgs.from_cli(args)
    )
    assert "holds 1 of them" in lines[0]


@pytest.mark.parametrize("kind", ["minicpm3", "mla_disabled"])
def test_kv_lora_rank_alone_is_not_mla(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A model type vLLM does not run as MLA (MiniCPM3's), or any with VLLM_MLA_DISABLE=1,
    caches K and V of its KV heads: 2 heads of 64, 128 KiB a chunk, as the Llama's."""
    cfg = MLA | {"model_type": "minicpm3"} if kind == "minicpm3" else MLA
    if kind == "mla_disabled":
        monkeypatch.setenv("VLLM_MLA_DISABLE", "1")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    err = refused(tmp_path, config(cpu_bytes=128 * KIB - 4096), "--block-size", "32")
    assert "2 KV heads of 64" in str(err) and "to at least 128" in str(err)


def test_an_mla_models_ssd_tier_is_one_file_whatever_the_tp_size(
    tmp_path: Path, mount_fs: MountFS
) -> None:
    """Rank 0 alone writes an MLA model's chunks: ``ssd_bytes`` is one file, not one a rank."""
    (tmp_path / "config.json").write_text(json.dumps(MLA))
    cfg = config(cpu_bytes="1MiB", ssd_dirs=str(mount_fs(8)), ssd_bytes="4MiB")
    args = EngineArgs.from_cli(("--block-size", "32", "-tp", "2"))
    lines = check_before_start(str(tmp_path), cfg, args)
    assert "SSD tier: a 3.94 MiB file in each of" in lines[1]  # whole slots of 288 KiB


def test_serve_checks_ssd_dirs_with_the_model_chunk(model: Path, mount_fs: MountFS) -> None:
    ro = mount_fs(8, read_only=True)
    env = {"MINIFLEX_SSD_DIRS": str(ro), "MINIFLEX_SSD_BYTES": "1MiB"}
    with pytest.raises(ConfigError, match=r"ssd_dirs=.*read-only file system"):
        check_settings([str(model), "--block-size", "32"], env)
    small = mount_fs(8)
    env = {"MINIFLEX_SSD_DIRS": str(small), "MINIFLEX_SSD_BYTES": "48MiB"}
    with pytest.raises(ConfigError, match=r"ssd_bytes='48.0 MiB': .* MiB free but"):
        check_settings(["--model", str(model)], env)
    env["MINIFLEX_SSD_BYTES"] = "1MiB"
    lines = check_settings(["--model", str(model)], env)
    assert "SSD tier: a 1.00 MiB file in each of" in lines[1] and "I/O: " in lines[1]


def test_miniflex_serve_refuses_in_one_line_without_starting_vllm(model: Path) -> None:
    for env, key in (
        ({"MODEL": "/nonexistent/model"}, "model"),
        ({"MODEL": "mdoel/tiny", "HF_HUB_OFFLINE": "1"}, "model"),  # a typo of a local path
        ({"MODEL": str(model), "MINIFLEX_CPU_BYTES": "64KiB"}, "cpu_bytes"),
    ):
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "miniflex.tools.cli", "serve", "--block-size", "32"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 2
        assert proc.stderr.startswith(f"miniflex: error: MiniFlex config {key}=")
        assert proc.stderr.count("\n") == 1, proc.stderr  # one line; vLLM never started
        assert time.monotonic() - started < 30
