"""``miniflex bench mixed``: long requests sharing a few prefixes among short unique ones.

An open loop at a fixed mean rate (Poisson arrivals, seeded): each request is
*long* with probability ``long_fraction`` (one of ``prefixes`` shared prefixes
of ``prefix_tokens``, plus a unique suffix) or *short* (``short_tokens``,
unique). Requests are sent at their arrival times whether or not earlier ones
finished, so queueing shows up in TTFT. The shared prefixes together are meant
to exceed vLLM's KV capacity, so APC keeps losing them to each other and to
the short requests; a tier below keeps them.

Reported per configuration and class: throughput (requests/s over the
makespan) and TTFT p50/p99 (from the scheduled arrival).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from miniflex.tools.bench.base import WARMUP_TOKENS, Log, Workload
from miniflex.tools.bench.driver import Arrival, Driver
from miniflex.tools.bench.engines import Measure
from miniflex.tools.bench.model import PromptMaker
from miniflex.tools.bench.samples import Sample, mean, percentile

__all__ = ["MixedWorkload", "class_row"]


def class_row(config: str, label: str, ss: list[Sample], makespan_s: float) -> dict[str, Any]:
    """One table row for the requests ``ss`` of one class under an open loop."""
    ttft = [s.ttft_ms for s in ss]
    tokens = sum(s.prompt_tokens + s.output_tokens for s in ss)
    return {
        "config": config,
        "class": label,
        "requests": len(ss),
        "req_per_s": round(len(ss) / makespan_s, 2) if makespan_s else None,
        "tok_per_s": round(tokens / makespan_s, 1) if makespan_s else None,
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p99_ms": percentile(ttft, 99),
        "ttft_mean_ms": mean(ttft),
        "vllm_hit": mean(s.vllm_hit_tokens for s in ss),
        "ext_hit": mean(s.external_tokens for s in ss),
    }


@dataclass
class MixedWorkload(Workload):
    name: ClassVar[str] = "mixed"
    title: ClassVar[str] = "Mixed traffic: long requests on shared prefixes among short ones"
    row_cases = ("class",)
    row_measures = (Measure("ttft_p50_ms"), Measure("ttft_p99_ms"), Measure("tok_per_s", True))

    prompts: PromptMaker
    prefixes: int = 4
    prefix_tokens: int = 8192
    suffix_tokens: int = 128
    short_tokens: int = 256
    long_fraction: float = 0.5
    rate: float = 4.0
    requests: int = 80
    max_tokens: int = 8
    seed: int = 0

    def max_prompt_tokens(self) -> int:
        return max(self.prefix_tokens + self.suffix_tokens, self.short_tokens)

    def working_set_tokens(self, capacity_tokens: int) -> int:
        unique = self.requests * max(self.suffix_tokens, self.short_tokens)
        return self.prefixes * self.prefix_tokens + unique

    def params(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "prompts"}

    def arrivals(self) -> list[Arrival]:
        rng = random.Random(f"mixed/{self.seed}")
        t, out = 0.0, []
        for i in range(self.requests):
            t += rng.expovariate(self.rate) if i else 0.0
            if rng.random() < self.long_fraction:
                prefix = self.prompts(self.prefix_tokens, "prefix", rng.randrange(self.prefixes))
                tokens = prefix + self.prompts(self.suffix_tokens, "suffix", i)
                out.append(Arrival(t, tokens, self.max_tokens, "long"))
            else:
                out.append(
                    Arrival(
                        t, self.prompts(self.short_tokens, "short", i), self.max_tokens, "short"
                    )
                )
        return out

    def run(self, driver: Driver, log: Log) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        driver.prefill(self.prompts(WARMUP_TOKENS, "warmup"), "warmup")
        driver.reset()
        arrivals = self.arrivals()
        log(
            f"{driver.name}: {len(arrivals)} requests at {self.rate}/s "
            f"(over {arrivals[-1].at_s:.1f} s)"
        )
        samples, makespan = driver.open_loop(arrivals)
        rows = [
            class_row(
                driver.name, label, [s for s in samples if label in ("all", s.label)], makespan
            )
            for label in ("long", "short", "all")
        ]
        for r in rows:
            log(
                f"{driver.name} {r['class']}: {r['req_per_s']} req/s, TTFT p50 "
                f"{r['ttft_p50_ms']} ms, p99 {r['ttft_p99_ms']} ms"
            )
        return rows, [s.as_dict() for s in samples]

    def summary(self, rows: list[dict[str, Any]], context: dict[str, Any]) -> dict[str, Any]:
        by = {(r["config"], r["class"]): r for r in rows}
        lines = []
        for (config, label), r in by.items():
            apc = by.get(("apc", label))
            if config != "apc" and apc and r["ttft_p50_ms"] and r["ttft_p99_ms"]:
                lines.append(
                    f"{config} {label}: TTFT p50 {apc['ttft_p50_ms'] / r['ttft_p50_ms']:.2f}x, "
                    f"p99 {apc['ttft_p99_ms'] / r['ttft_p99_ms']:.2f}x faster than APC"
                )
        return {"lines": lines}

    def draw(self, plt: Any, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        for ax, label in zip(axes, ("long", "short"), strict=True):
            sub = [r for r in rows if r["class"] == label]
            xs = range(len(sub))
            ax.bar([x - 0.2 for x in xs], [r["ttft_p50_ms"] or 0 for r in sub], 0.4, label="p50")
            ax.bar([x + 0.2 for x in xs], [r["ttft_p99_ms"] or 0 for r in sub], 0.4, label="p99")
            ax.set_xticks(list(xs), [r["config"] for r in sub], rotation=20)
            ax.set_title(f"{label} requests")
            ax.set_ylabel("TTFT ms")
        axes[0].legend(fontsize=8)
        fig.suptitle(f"{self.title}, {self.rate} req/s", fontsize=10)
