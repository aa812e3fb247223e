"""Byte counts as people read them: ``format_bytes(46137344) == '44.0 MiB'``.

Every message that shows a size uses this, so a small disk is never reported
as ``0.0 GiB``.
"""

from __future__ import annotations

__all__ = ["format_bytes"]

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: int | float) -> str:
    """``n`` bytes in the largest binary unit that keeps the number at least 1.

    Three significant digits at most: ``512 B``, ``4.00 KiB``, ``44.0 MiB``,
    ``1.50 GiB``, ``512 GiB``; negative counts keep their sign.
    """
    if n < 0:
        return "-" + format_bytes(-n)
    if n < 1024:
        return f"{int(n)} B"
    value, unit = float(n), "B"
    for unit in _UNITS:
        value /= 1024
        if value < 1024 or unit == _UNITS[-1]:
            break
    if value >= 100:
        return f"{value:.0f} {unit}"
    return f"{value:.1f} {unit}" if value >= 10 else f"{value:.2f} {unit}"
