"""SIGTERM to ``miniflex serve`` with requests in flight: every client gets an answer and
the server exits, within the drain time and a few seconds."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.e2e.serve_proc import free_port, serve_command, wait_healthy

pytestmark = pytest.mark.e2e
CLIENTS = 24
DRAIN_S = 2


def test_sigterm_answers_every_client_and_exits(tiny_model: Path, tmp_path: Path) -> None:
    """vLLM alone (and miniflex serve before its shutdown guard) stopped the engine and then
    waited for connections that its unfinished requests held open: every such client hung
    until SIGKILL."""
    port = free_port()
    env = {**os.environ, "MODEL": str(tiny_model), "PORT": str(port), "MINIFLEX_CPU_BYTES": "64MiB"}
    cmd = serve_command("--max-num-seqs", "8", "--shutdown-timeout", str(DRAIN_S))
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    answers: dict[int, object] = {}
    try:
        wait_healthy(proc, url, str(tmp_path / "server.log"))
        model = requests.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]

        def client(i: int) -> None:
            body = {
                "model": model,
                "prompt": [3 + (i * 7 + j) % 1900 for j in range(600)],
                "max_tokens": 300,
                "ignore_eos": True,
                "detokenize": False,
            }
            try:
                answers[i] = requests.post(
                    url + "/v1/completions", json=body, timeout=120
                ).status_code
            except requests.RequestException as exc:
                answers[i] = type(exc).__name__

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while not answers and time.monotonic() < deadline:  # the first batch is done...
            time.sleep(0.1)
        assert len(answers) < CLIENTS // 2, answers  # ...and most wait or run
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # to the server process alone, as a supervisor does
        rc = proc.wait(timeout=DRAIN_S + 30)
        took = time.monotonic() - stopped
        for t in threads:
            t.join(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    text = (tmp_path / "server.log").read_text()
    assert rc == 0, text[-3000:]
    assert sorted(answers) == list(range(CLIENTS)), answers  # nobody still waiting
    assert set(answers.values()) <= {200, 503}, answers
    assert 503 in answers.values(), answers  # the drain was too short for all of them
    assert took < DRAIN_S + 20, (took, text[-3000:])
