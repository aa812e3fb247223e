"""Configurations run on more than one engine: each one's mean and spread, and the ratios.

A configuration named twice in ``--configs`` (``miniflex-cpu`` and
``miniflex-cpu#2``) runs on two engines, one after the other. Two engines of
one configuration do not measure the same: TTFTs of one request at a time move
by up to a fifth between them. A difference between configurations means
something only beside that spread, so when any configuration ran on more than
one engine, :func:`between_engines` gives a table with, per configuration,
case and measure:

* ``mean``: the mean of that configuration's engines' row values;
* ``spread_x``: its slowest engine against its fastest (1.0 with one engine);
* ``vs_first``: its mean against the first configuration's, oriented so that
  above 1 is better (a lower TTFT, a higher throughput).

A workload names its cases (the row columns that tell its rows apart beside
``config``) and its measures (:class:`Measure`); the runner prints the table
below the workload's own and keeps it in the JSON under ``"engines"``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Measure", "between_engines", "configuration"]


@dataclass(frozen=True)
class Measure:
    """A row column compared between engines; ``higher_is_better`` for throughputs."""

    column: str
    higher_is_better: bool = False


def configuration(name: str) -> str:
    """The configuration an engine ran: its ``--configs`` name without the ``#N`` repeat."""
    return name.partition("#")[0]


def between_engines(
    rows: Sequence[dict[str, Any]], cases: Sequence[str], measures: Sequence[Measure]
) -> list[dict[str, Any]]:
    """The table described above, by measure, case and configuration; empty unless some
    configuration ran on two or more engines.

    A row that lacks a case column or has no value for a measure is left out of that
    measure (a failed engine, a measure this connector cannot report).
    """
    configs = list(dict.fromkeys(configuration(r["config"]) for r in rows))
    if not measures or len(configs) == len({r["config"] for r in rows}):
        return []  # every configuration ran on one engine
    values = _values(rows, cases, measures)
    in_order = dict.fromkeys(key[1] for key in values)  # cases, in order of appearance
    out: list[dict[str, Any]] = []
    for m in measures:
        for case in in_order:
            named = dict(zip(cases, case, strict=True))
            ref = values.get((configs[0], case, m))
            out += [
                _entry(config, named, m, values[(config, case, m)], ref)
                for config in configs
                if (config, case, m) in values
            ]
    return out


def _entry(
    config: str, case: dict[str, Any], m: Measure, vals: list[float], ref: list[float] | None
) -> dict[str, Any]:
    """One configuration's row: its engines' ``vals``, against the first one's ``ref``."""
    mean = statistics.fmean(vals)
    return {
        "config": config,
        **case,
        "measure": m.column,
        "engines": len(vals),
        "mean": round(mean, 2),
        "spread_x": round(max(vals) / min(vals), 3) if min(vals) > 0 else None,
        "vs_first": _ratio(mean, statistics.fmean(ref) if ref else None, m.higher_is_better),
    }


def _values(
    rows: Sequence[dict[str, Any]], cases: Sequence[str], measures: Sequence[Measure]
) -> dict[tuple[str, tuple[Any, ...], Measure], list[float]]:
    """(configuration, case, measure) -> each engine's value, in run order."""
    values: dict[tuple[str, tuple[Any, ...], Measure], list[float]] = {}
    for m in measures:
        for r in rows:
            if any(c not in r for c in cases) or not isinstance(r.get(m.column), int | float):
                continue
            key = (configuration(r["config"]), tuple(r[c] for c in cases), m)
            values.setdefault(key, []).append(float(r[m.column]))
    return values


def _ratio(mean: float, ref: float | None, higher_is_better: bool) -> float | None:
    if ref is None or mean <= 0 or ref <= 0:
        return None
    return round(mean / ref if higher_is_better else ref / mean, 3)
