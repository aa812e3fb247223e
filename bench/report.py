"""Shared output helper for the benchmarks (it lives in ``miniflex.bench.report``)."""

from __future__ import annotations

from miniflex.bench.report import emit, format_table

__all__ = ["emit", "format_table"]
