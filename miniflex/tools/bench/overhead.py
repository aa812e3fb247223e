"""``miniflex bench overhead``: what a connector costs when nothing is ever reused.

Every prompt is unique, so no configuration can hit; a connector only adds its
lookups and its stores. Two measurements per configuration:

* **batch**: ``batch_prompts`` requests sent at once (a closed batch); the
  throughput is prompt plus output tokens over the makespan, for each of ``rounds``
  rounds. The loss is taken between medians: on the H200 one round moves by up to
  5-10% between rounds of the same engine (the best round is reported too);
* **serial**: ``serial_prompts`` requests one at a time; their mean TTFT.

For MiniFlex the rows also give what it took from vLLM per batch round
(median): the wall time of its hooks on vLLM's threads and the CPU time of its
own threads (``clocks.py``), where the driver can read them.

The summary gives each configuration's throughput loss and TTFT increase
against ``apc`` (the target for MiniFlex is at most 2%).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, ClassVar

from miniflex.tools.bench.base import WARMUP_TOKENS, Log, Workload
from miniflex.tools.bench.driver import Arrival, Driver, taken_ms
from miniflex.tools.bench.engines import Measure
from miniflex.tools.bench.model import PromptMaker
from miniflex.tools.bench.samples import mean, percentile

__all__ = ["OverheadWorkload"]

TARGET_PCT = 2.0


@dataclass
class OverheadWorkload(Workload):
    name: ClassVar[str] = "overhead"
    title: ClassVar[str] = "Connector overhead with no reuse (unique prompts)"
    row_cases = ("batch",)
    row_measures = (Measure("tok_per_s_median", True), Measure("serial_ttft_p50_ms"))

    prompts: PromptMaker
    batch_prompts: int = 32
    prompt_tokens: int = 2048
    max_tokens: int = 16
    serial_prompts: int = 8
    rounds: int = 2

    def max_prompt_tokens(self) -> int:
        return self.prompt_tokens

    def working_set_tokens(self, capacity_tokens: int) -> int:
        return 0  # nothing is reused: the tier's size does not matter

    def params(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "prompts"}

    def run(self, driver: Driver, log: Log) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        driver.prefill(self.prompts(WARMUP_TOKENS, "warmup"), "warmup")
        driver.reset()
        best: tuple[float, float, list] = (0.0, 0.0, [])
        rates: list[float] = []
        hooks_ms: list[float] = []  # MiniFlex's hooks on vLLM's threads, per round
        threads_ms: list[float] = []  # CPU of MiniFlex's own threads, per round
        samples: list[dict[str, Any]] = []
        for r in range(self.rounds):
            batch = [
                Arrival(
                    0.0, self.prompts(self.prompt_tokens, "unique", r, i), self.max_tokens, "batch"
                )
                for i in range(self.batch_prompts)
            ]
            before = driver.time_taken()
            ss, makespan = driver.open_loop(batch)
            tok_s = sum(s.prompt_tokens + s.output_tokens for s in ss) / makespan
            taken = taken_ms(before, driver.time_taken())
            log(
                f"{driver.name}: batch round {r + 1}: {tok_s:,.0f} tok/s over {makespan:.2f} s"
                + (
                    f"; MiniFlex hooks {taken[0]:.1f} ms, threads' CPU {taken[1]:.1f} ms"
                    if taken
                    else ""
                )
            )
            if taken:
                hooks_ms.append(taken[0])
                threads_ms.append(taken[1])
            rates.append(tok_s)
            samples += [dict(s.as_dict(), round=r) for s in ss]
            if tok_s > best[0]:
                best = (tok_s, makespan, ss)
        serial = [
            driver.prefill(self.prompts(self.prompt_tokens, "unique-serial", i), "serial")
            for i in range(self.serial_prompts)
        ]
        samples += [s.as_dict() for s in serial]
        tok_s, makespan, ss = best
        everything = list(ss) + serial
        row = {
            "config": driver.name,
            "batch": self.batch_prompts,
            "tok_per_s": round(tok_s, 1),
            "tok_per_s_median": round(statistics.median(rates), 1),
            "rounds_tok_per_s": [round(x, 1) for x in rates],
            "makespan_s": round(makespan, 3),
            "batch_ttft_p50_ms": percentile([s.ttft_ms for s in ss], 50),
            "serial_ttft_mean_ms": mean(s.ttft_ms for s in serial),
            "serial_ttft_p50_ms": percentile([s.ttft_ms for s in serial], 50),
            "cached": sum(s.cached_tokens or 0 for s in everything),
            "hooks_ms_median": round(statistics.median(hooks_ms), 1) if hooks_ms else None,
            "threads_cpu_ms_median": round(statistics.median(threads_ms), 1)
            if threads_ms
            else None,
        }
        log(f"{driver.name}: serial TTFT mean {row['serial_ttft_mean_ms']} ms")
        return [row], samples

    def summary(self, rows: list[dict[str, Any]], context: dict[str, Any]) -> dict[str, Any]:
        apc = next((r for r in rows if r["config"] == "apc"), None)
        out: dict[str, Any] = {"target_pct": TARGET_PCT, "vs_apc": {}, "lines": []}
        if apc is None:
            out["lines"].append("no apc row: losses are not computed")
            return out
        for r in rows:
            if r is apc or not r["tok_per_s"] or not r["serial_ttft_mean_ms"]:
                continue
            loss = round(100 * (1 - r["tok_per_s_median"] / apc["tok_per_s_median"]), 2)
            best = round(100 * (1 - r["tok_per_s"] / apc["tok_per_s"]), 2)
            slower = round(100 * (r["serial_ttft_mean_ms"] / apc["serial_ttft_mean_ms"] - 1), 2)
            met = "met" if loss <= TARGET_PCT and slower <= TARGET_PCT else "NOT met"
            out["vs_apc"][r["config"]] = {
                "throughput_loss_pct": loss,
                "best_round_loss_pct": best,
                "ttft_increase_pct": slower,
            }
            out["lines"].append(
                f"{r['config']}: throughput {-loss:+.2f}% (median round; best rounds "
                f"{-best:+.2f}%), serial TTFT {slower:+.2f}% vs APC "
                f"(target: at most {TARGET_PCT}% worse; {met})"
            )
        return out

    def draw(self, plt: Any, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
        names = [r["config"] for r in rows]
        ax1.bar(names, [r["tok_per_s_median"] for r in rows])
        ax1.set_ylabel("tokens/s (batch, median round)")
        ax2.bar(names, [r["serial_ttft_mean_ms"] or 0 for r in rows])
        ax2.set_ylabel("mean TTFT ms (serial)")
        for ax in (ax1, ax2):
            ax.tick_params(axis="x", rotation=20)
        fig.suptitle(self.title, fontsize=10)
