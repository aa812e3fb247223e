"""A plain aligned text table for command output (``miniflex tune``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["format_table"]


def _cell(value: object) -> str:
    return f"{value:,.2f}" if isinstance(value, float) else str(value)


def format_table(rows: Sequence[Mapping[str, object]]) -> str:
    """Columns are the first row's keys; numbers right-aligned, text left-aligned.

    Example: ``format_table([{"mover": "dma", "GB/s": 50.0}])`` gives::

        mover   GB/s
        -----  -----
        dma    50.00
    """
    if not rows:
        return "(no rows)"
    columns = list(rows[0])
    cells = [[_cell(row.get(c, "")) for c in columns] for row in rows]
    numeric = [
        all(isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool) for r in rows)
        for c in columns
    ]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(columns), line(["-" * w for w in widths]), *map(line, cells)])
