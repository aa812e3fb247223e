"""Benchmark output: progress lines, aligned text tables, JSON files.

Every benchmark prints progress to stderr (time-stamped, so a slow step is
visible while it runs) and its results to stdout as a table; the JSON holds
everything, including per-request samples.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from miniflex.tools.table import format_table

__all__ = ["Progress", "emit", "format_table", "write_json"]


class Progress:
    """``[bench NAME HH:MM:SS] message`` lines on stderr, flushed at once."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, msg: str) -> None:
        print(f"[bench {self.name} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write_json(path: str | Path, payload: Mapping[str, Any]) -> Path:
    """Write ``payload`` as indented JSON (parent directories are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)  # a reader never sees half a file, even if the run is killed
    return path


def emit(
    title: str,
    rows: list[dict],
    json_path: str | None = None,
    extra: dict | None = None,
) -> None:
    """Print ``title``, the table of ``rows`` and one JSON line; optionally save the JSON.

    The JSON object is ``{"title": title, "rows": rows, **extra}`` on a single
    line, so scripts can pick it out of the output. If ``json_path`` is given
    the same object is written there (parent directories are created).
    """
    payload = {"title": title, "rows": rows, **(extra or {})}
    text = json.dumps(payload, default=str)
    print(title)
    print(format_table(rows))
    print(text, flush=True)
    if json_path is not None:
        parent = os.path.dirname(os.path.abspath(json_path))
        os.makedirs(parent, exist_ok=True)
        with open(json_path, "w", encoding="utf-8") as f:
            f.write(text + "\n")
