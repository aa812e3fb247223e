"""Shared output helper for the benchmarks: an aligned text table plus one JSON line."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["emit", "format_table"]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}"
    return str(value)


def format_table(rows: list[Mapping[str, Any]]) -> str:
    """Render ``rows`` as an aligned table; columns are the keys of the first row.

    Numbers are right-aligned, everything else left-aligned; a key missing from
    a later row renders as an empty cell.
    """
    if not rows:
        return "(no rows)"
    columns = list(rows[0])
    cells = [[_cell(row.get(c, "")) for c in columns] for row in rows]
    numeric = [
        all(
            isinstance(row.get(c), (int, float)) and not isinstance(row.get(c), bool)
            for row in rows
        )
        for c in columns
    ]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]

    def line(values: list[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [line(columns), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


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
