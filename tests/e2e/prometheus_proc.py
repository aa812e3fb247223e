"""A real Prometheus server for the tests: scrapes given targets every second.

Debian's ``prometheus`` package (``scripts/test.sh`` installs it as root); a test that needs
it skips only where it is missing and cannot be installed.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests

from tests.e2e.serve_proc import free_port, wait_healthy

__all__ = ["Prometheus", "prometheus_binary", "running_prometheus"]


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


class Prometheus:
    """The HTTP API of a running server."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: ``[{"metric": {labels}, "value": [t, "v"]}, ...]``."""
        r = requests.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
        return body["data"]["result"]

    def scrapes(self, job: str) -> int:
        """Successful scrapes of ``job`` kept so far (0 before the first)."""
        got = self.query(f'count_over_time(up{{job="{job}"}}[1h])')
        return int(float(got[0]["value"][1])) if got else 0


@contextmanager
def running_prometheus(
    work: Path, job: str, targets: Sequence[str], scrape_ms: int = 1000
) -> Iterator[Prometheus]:
    """Prometheus scraping ``targets`` (``host:port``, path ``/metrics``) as ``job``, every
    ``scrape_ms``."""
    binary = prometheus_binary()
    assert binary is not None, "prometheus is not installed"
    work.mkdir(parents=True, exist_ok=True)
    config = work / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {scrape_ms}ms\n  evaluation_interval: {scrape_ms}ms\n"
        f"scrape_configs:\n  - job_name: {job}\n    static_configs:\n"
        f"      - targets: [{', '.join(repr(t) for t in targets)}]\n"
    )
    port = free_port()
    cmd = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={work / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with (work / "prometheus.log").open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(proc, url, str(work / "prometheus.log"), timeout_s=60, path="/-/ready")
            yield Prometheus(url)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
