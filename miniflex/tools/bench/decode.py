"""``miniflex bench decode``: output tokens per second when nothing is reused.

Each case sends ``prompts`` unique prompts of ``prompt_tokens`` at once and asks
for ``max_tokens`` each, so most engine steps are uniform decode batches: the
steps vLLM replays as full CUDA graphs. A connector that costs vLLM its full
graphs, or adds work to every step, shows up here. Every round uses fresh
prompts (a connector stores them, as it would in service); the median round
is compared, because rounds of one engine move by a few percent.

Default cases: a decode-heavy batch (32 x 512 tokens, 256 out) and a
long-context decode (2 x 12,000 tokens, 256 out). The target for MiniFlex is
at least 0.99x APC's output tokens/s in the same run.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, ClassVar

from miniflex.tools.bench.base import WARMUP_TOKENS, Log, Workload
from miniflex.tools.bench.driver import Arrival, Driver
from miniflex.tools.bench.engines import Measure
from miniflex.tools.bench.model import PromptMaker

__all__ = ["DecodeCase", "DecodeWorkload"]

TARGET_X = 0.99


@dataclass(frozen=True)
class DecodeCase:
    """``prompts`` unique prompts of ``prompt_tokens``, ``max_tokens`` out each, sent at once."""

    prompts: int
    prompt_tokens: int
    max_tokens: int

    @property
    def label(self) -> str:
        return f"{self.prompts}x{self.prompt_tokens}x{self.max_tokens}"

    @classmethod
    def parse(cls, text: str) -> DecodeCase:
        """``"32x512x256"`` -> 32 prompts of 512 tokens, 256 out."""
        parts = text.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"expected PROMPTSxTOKENSxOUT (e.g. 32x512x256), got {text!r}")
        return cls(*(int(p) for p in parts))


DEFAULT_CASES = (DecodeCase(32, 512, 256), DecodeCase(2, 12000, 256))


@dataclass
class DecodeWorkload(Workload):
    name: ClassVar[str] = "decode"
    title: ClassVar[str] = "Decode throughput with no reuse (batches sent at once)"
    row_cases = ("case",)
    row_measures = (Measure("out_tok_s", True),)

    prompts: PromptMaker
    cases: tuple[DecodeCase, ...] = DEFAULT_CASES
    rounds: int = 3

    def max_prompt_tokens(self) -> int:
        return max(c.prompt_tokens for c in self.cases) + max(c.max_tokens for c in self.cases)

    def working_set_tokens(self, capacity_tokens: int) -> int:
        return 0  # nothing is reused

    def params(self) -> dict[str, Any]:
        return {"cases": [c.label for c in self.cases], "rounds": self.rounds}

    def run(self, driver: Driver, log: Log) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        driver.prefill(self.prompts(WARMUP_TOKENS, "warmup"), "warmup")
        rows, samples = [], []
        for case in self.cases:
            rates: list[float] = []
            for r in range(self.rounds):
                batch = [
                    Arrival(
                        0.0,
                        self.prompts(case.prompt_tokens, "decode", case.label, r, i),
                        case.max_tokens,
                        case.label,
                    )
                    for i in range(case.prompts)
                ]
                ss, makespan = driver.open_loop(batch)
                out = sum(s.output_tokens for s in ss)
                rates.append(out / makespan if makespan else 0.0)
                samples += [dict(s.as_dict(), round=r) for s in ss]
                log(f"{driver.name} {case.label} round {r + 1}: {rates[-1]:,.0f} output tok/s")
            rows.append(
                {
                    "config": driver.name,
                    "case": case.label,
                    "out_tok_s": round(statistics.median(rates), 1),
                    "rounds_out_tok_s": [round(x, 1) for x in rates],
                }
            )
        return rows, samples

    def summary(self, rows: list[dict[str, Any]], context: dict[str, Any]) -> dict[str, Any]:
        apc = {r["case"]: r for r in rows if r["config"] == "apc"}
        out: dict[str, Any] = {"target_x": TARGET_X, "vs_apc": {}, "lines": []}
        for r in rows:
            base = apc.get(r["case"])
            if r["config"] == "apc" or base is None or not base["out_tok_s"]:
                continue
            x = round(r["out_tok_s"] / base["out_tok_s"], 3)
            out["vs_apc"].setdefault(r["config"], {})[r["case"]] = x
            met = "met" if x >= TARGET_X else "NOT met"
            out["lines"].append(
                f"{r['config']} {r['case']}: {x:.3f}x APC's output tokens/s "
                f"(median round; target at least {TARGET_X}x: {met})"
            )
        return out

    def draw(self, plt: Any, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
        cases = list(dict.fromkeys(r["case"] for r in rows))
        configs = list(dict.fromkeys(r["config"] for r in rows))
        fig, axes = plt.subplots(1, len(cases), figsize=(4.5 * len(cases), 3.6), squeeze=False)
        for ax, case in zip(axes[0], cases, strict=True):
            by = {r["config"]: r["out_tok_s"] for r in rows if r["case"] == case}
            ax.bar(configs, [by.get(c, 0) for c in configs])
            ax.set_title(case)
            ax.set_ylabel("output tokens/s (median round)")
            ax.tick_params(axis="x", rotation=20)
        fig.suptitle(self.title, fontsize=10)
