"""The workload interface: what one benchmark measures on one engine configuration."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from miniflex.tools.bench.driver import Driver
from miniflex.tools.bench.engines import Measure

__all__ = ["WARMUP_TOKENS", "Log", "Workload"]

Log = Callable[[str], None]

WARMUP_TOKENS = 256
"""The warm-up prompt each workload sends first, untimed (it also sizes ``max_model_len``)."""


class Workload(ABC):
    """A benchmark that runs on each configuration in turn, then compares them.

    The runner calls :meth:`run` once per configuration (the engine is started
    before and shut down after), then :meth:`summary` and :meth:`draw` once
    with every configuration's rows. Rows are flat dicts, printed as a table;
    ``samples`` (per request) go to the JSON only.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    row_cases: ClassVar[tuple[str, ...]] = ()
    """Row columns besides ``config`` that tell one configuration's rows apart."""
    row_measures: ClassVar[tuple[Measure, ...]] = ()
    """Row columns compared between engines (:mod:`~miniflex.tools.bench.engines`); none: no
    table."""

    @abstractmethod
    def max_prompt_tokens(self) -> int:
        """The longest prompt this workload sends (sizes ``max_model_len``)."""

    @abstractmethod
    def working_set_tokens(self, capacity_tokens: int) -> int:
        """Tokens a tier must hold so that every reuse this workload makes can hit.

        Sizes the tiers of offline runs (:mod:`miniflex.tools.bench.sizing`).
        """

    @abstractmethod
    def run(self, driver: Driver, log: Log) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Measure on one configuration: (table rows, per-request samples)."""

    @abstractmethod
    def summary(self, rows: list[dict[str, Any]], context: dict[str, Any]) -> dict[str, Any]:
        """Headline numbers across configurations (``context``: run-wide facts)."""

    @abstractmethod
    def draw(self, plt: Any, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
        """Draw the plot of ``rows`` into a new matplotlib figure."""

    def params(self) -> dict[str, Any]:
        """The workload's parameters, recorded in the JSON."""
        return dict(vars(self))
