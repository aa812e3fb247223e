"""PNG plots with matplotlib, which is optional: without it a plot is skipped, never fatal."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["save_plot"]


def save_plot(path: str | Path, draw: Callable[[Any], None]) -> str:
    """Call ``draw(pyplot)`` and save the current figure to ``path``; returns a one-line note.

    ``draw`` creates the figure and its axes. The note says where the PNG went,
    or why there is none (matplotlib missing, or drawing failed).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install matplotlib)"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        draw(plt)
        plt.tight_layout()
        plt.savefig(path, dpi=110)
    except (ValueError, TypeError, KeyError, OSError) as exc:
        return f"plot skipped: drawing {path.name} failed: {exc!r}"
    finally:
        plt.close("all")
    return f"plot written to {path}"
