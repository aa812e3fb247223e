"""Argument types of ``miniflex bench`` that refuse nonsense before anything starts.

Each is an ``argparse`` ``type=``: a value out of range ends the command with
status 2 and one line naming the option, e.g.
``argument --soak-requests: expected an integer >= 1, got '-5'``.
Importing this module imports nothing heavy.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = [
    "at_least",
    "count",
    "count0",
    "counts",
    "fraction",
    "min_max",
    "positive",
    "primaries",
    "rate",
]


def at_least(low: int) -> Callable[[str], int]:
    """A whole number of at least ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return value

    return parse


count = at_least(1)
"""Requests, rounds, clients, blocks, tokens: 1 or more."""

count0 = at_least(0)
"""Chunks to damage, prompts run one at a time: 0 or more."""


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A share from 0 to 1."""
    value = _number(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {text!r}")
    return value


def positive(text: str) -> float:
    """A number above 0 (a ratio, a share of memory)."""
    value = _number(text)
    if value <= 0.0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def rate(text: str) -> float:
    """Requests per second: 0 (all at once) or more."""
    value = _number(text)
    if value < 0.0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def counts(text: str) -> tuple[int, ...]:
    """A comma-separated list of one or more counts, e.g. ``1024,8192``."""
    values = tuple(count(x.strip()) for x in text.split(",") if x.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"expected one or more integers, got {text!r}")
    return values


def min_max(text: str) -> tuple[int, int]:
    """``MIN,MAX`` counts with MIN <= MAX."""
    values = counts(text)
    if len(values) != 2 or values[0] > values[1]:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX with MIN <= MAX, got {text!r}")
    return values[0], values[1]


def primaries(text: str) -> int:
    """A private store's cluster size: 0 (one server, no cluster) or 2 and more."""
    value = count0(text)
    if value == 1:
        raise argparse.ArgumentTypeError(f"expected 0 (one server) or at least 2, got {text!r}")
    return value
