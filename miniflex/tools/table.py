"""A plain aligned text table for command and benchmark output."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["format_table"]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}"
    if value is None:
        return "-"
    return str(value)


def format_table(rows: list[Mapping[str, Any]]) -> str:
    """Render ``rows`` as an aligned table; columns are the keys of the first row.

    Example: ``format_table([{"mover": "dma", "GB/s": 50.0}])`` gives::

        mover   GB/s
        -----  -----
        dma    50.00

    Numbers are right-aligned, everything else left-aligned; a key missing from
    a later row renders as an empty cell, a ``None`` value as ``-``.
    """
    if not rows:
        return "(no rows)"
    columns = list(rows[0])
    cells = [[_cell(row.get(c, "")) for c in columns] for row in rows]
    numeric = [
        all(
            isinstance(row.get(c), (int, float, type(None))) and not isinstance(row.get(c), bool)
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
