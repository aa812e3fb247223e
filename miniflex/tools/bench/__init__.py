"""Benchmarks of vLLM with and without MiniFlex: ``miniflex bench ttft|overflow|mixed|overhead``.

Each workload (``ttft.py``, ``overflow.py``, ``mixed.py``, ``overhead.py``)
runs against a :class:`~miniflex.tools.bench.driver.Driver`: an in-process vLLM
``LLM`` per engine configuration (``offline.py``; the configurations are in
``configs.py``) or a running OpenAI-compatible server (``http.py``).
``runner.py`` runs them side by side and writes a table, JSON and a PNG per
workload. Nothing here imports vLLM, torch or matplotlib at import time.
"""

from miniflex.tools.bench.args import WORKLOADS, add_arguments
from miniflex.tools.bench.cli import run

__all__ = ["WORKLOADS", "add_arguments", "run"]
