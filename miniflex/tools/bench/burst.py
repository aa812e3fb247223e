"""``miniflex bench burst``: many requests over shared prefixes, all arriving together.

Each round sends ``requests`` requests at once (or at ``rate`` per second):
request ``i`` is one of ``prefixes`` shared prefixes of ``prefix_tokens``
(each used ``requests / prefixes`` times, in a shuffled order) plus a unique
suffix, and asks for ``max_tokens``. The prefixes together are meant to be
larger than vLLM's KV cache and than the CPU tier (give ``--cpu-bytes``), so
that a cache has to choose what to keep. Rounds run back to back on the same
engine: the first fills the caches, the later ones show what each
configuration keeps and how fast it serves it under load.

Reported per configuration and round: makespan, output tokens/s, TTFT p50 and
p99 (from the arrival), prompt tokens served from cache (vLLM's own hit plus
a connector's, as vLLM reports them), MiniFlex's hits per tier, and the time
MiniFlex took: wall time in its hooks on vLLM's threads and CPU time of its
own threads (``hooks_ms``, ``threads_ms``). The
summary compares the last round with the native connector's (targets:
throughput at least 1.15x, cached tokens at least as many) and MiniFlex
CPU+SSD with its CPU tier alone (at least 0.98x).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

from miniflex.tools.bench.base import WARMUP_TOKENS, Log, Workload
from miniflex.tools.bench.driver import Arrival, Driver, taken_ms
from miniflex.tools.bench.engines import Measure
from miniflex.tools.bench.model import PromptMaker
from miniflex.tools.bench.samples import Sample, percentile

__all__ = ["BurstWorkload"]

TARGET_VS_NATIVE = 1.15
TARGET_SSD_VS_CPU = 0.98


@dataclass
class BurstWorkload(Workload):
    name: ClassVar[str] = "burst"
    title: ClassVar[str] = "Burst: requests over shared prefixes, sent together"
    row_cases = ("round",)
    row_measures = (
        Measure("out_tok_s", True),
        Measure("ttft_p50_ms"),
        Measure("ttft_p99_ms"),
        Measure("cached_pct", True),
    )

    prompts: PromptMaker
    prefixes: int = 12
    prefix_tokens: int = 4096
    suffix_tokens: int = 64
    requests: int = 96
    max_tokens: int = 64
    rounds: int = 3
    rate: float = 0.0  # requests/s (Poisson); 0: all at once
    seed: int = 0

    def max_prompt_tokens(self) -> int:
        return self.prefix_tokens + self.suffix_tokens

    def working_set_tokens(self, capacity_tokens: int) -> int:
        return self.prefixes * self.prefix_tokens

    def params(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "prompts"}

    def arrivals(self, round_: int) -> list[Arrival]:
        """One round's requests: every prefix equally often, shuffled, fresh suffixes."""
        rng = random.Random(f"burst/{self.seed}/{round_}")
        order = [i % self.prefixes for i in range(self.requests)]
        rng.shuffle(order)
        t, out = 0.0, []
        for i, p in enumerate(order):
            if self.rate > 0 and i:
                t += rng.expovariate(self.rate)
            tokens = self.prompts(self.prefix_tokens, "burst-prefix", p) + self.prompts(
                self.suffix_tokens, "burst-suffix", round_, i
            )
            out.append(Arrival(t, tokens, self.max_tokens, f"prefix{p}"))
        return out

    def run(self, driver: Driver, log: Log) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        driver.prefill(self.prompts(WARMUP_TOKENS, "warmup"), "warmup")
        driver.reset()
        rows, samples = [], []
        for r in range(self.rounds):
            before = driver.time_taken()
            ss, makespan = driver.open_loop(self.arrivals(r))
            row = _round_row(driver.name, r, ss, makespan)
            taken = taken_ms(before, driver.time_taken())
            row["hooks_ms"] = round(taken[0], 1) if taken else None
            row["threads_ms"] = round(taken[1], 1) if taken else None
            rows.append(row)
            samples += [dict(s.as_dict(), round=r) for s in ss]
            log(
                f"{driver.name} round {r + 1}: {row['makespan_s']} s, {row['out_tok_s']:,.0f} "
                f"output tok/s, TTFT p50 {row['ttft_p50_ms']} ms p99 {row['ttft_p99_ms']} ms, "
                f"cached {row['cached_pct']}%"
            )
        return rows, samples

    def summary(self, rows: list[dict[str, Any]], context: dict[str, Any]) -> dict[str, Any]:
        last = max((r["round"] for r in rows), default=0)
        final = {r["config"]: r for r in rows if r["round"] == last}
        out: dict[str, Any] = {"round": last, "vs_native": {}, "lines": []}
        native = final.get("native")
        for name, r in final.items():
            if native is not None and name.startswith("miniflex") and native["out_tok_s"]:
                x = round(r["out_tok_s"] / native["out_tok_s"], 3)
                cached = r["cached_tokens"] >= native["cached_tokens"]
                out["vs_native"][name] = {"throughput_x": x, "cached_at_least": cached}
                out["lines"].append(
                    f"{name}: {x:.2f}x native's output tokens/s (target {TARGET_VS_NATIVE}x: "
                    f"{'met' if x >= TARGET_VS_NATIVE else 'NOT met'}), cached "
                    f"{r['cached_tokens']:,} vs {native['cached_tokens']:,} tokens "
                    f"({'met' if cached else 'NOT met'})"
                )
        cpu, ssd = final.get("miniflex-cpu"), final.get("miniflex-ssd")
        if cpu and ssd and cpu["out_tok_s"]:
            x = round(ssd["out_tok_s"] / cpu["out_tok_s"], 3)
            out["ssd_vs_cpu_x"] = x
            out["lines"].append(
                f"miniflex-ssd: {x:.2f}x miniflex-cpu's output tokens/s (target at least "
                f"{TARGET_SSD_VS_CPU}x: {'met' if x >= TARGET_SSD_VS_CPU else 'NOT met'})"
            )
            out.update(_ssd_vs_cpu_by_round(rows, out["lines"]))
        return out

    def draw(self, plt: Any, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
        configs = list(dict.fromkeys(r["config"] for r in rows))
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
        for name in configs:
            mine = [r for r in rows if r["config"] == name]
            xs = [r["round"] + 1 for r in mine]
            ax1.plot(xs, [r["out_tok_s"] for r in mine], marker="o", label=name)
            ax2.plot(xs, [r["cached_pct"] for r in mine], marker="o", label=name)
        ax1.set_ylabel("output tokens/s")
        ax2.set_ylabel("prompt tokens from cache (%)")
        rounds = sorted({r["round"] + 1 for r in rows})
        for ax in (ax1, ax2):
            ax.set_xlabel("round")
            ax.set_xticks(rounds)
        ax1.legend(fontsize=8)
        fig.suptitle(self.title, fontsize=10)


def _ssd_vs_cpu_by_round(rows: list[dict[str, Any]], lines: list[str]) -> dict[str, Any]:
    """CPU+SSD against the CPU tier alone in every round and over all of them (the output
    tokens of every round over their makespans): one round is a noisy sample, since the
    order of admission changes which requests run together."""
    by = {(r["config"], r["round"]): r for r in rows}
    rounds = sorted({r["round"] for r in rows if r["config"] == "miniflex-ssd"})
    pairs = [(by.get(("miniflex-ssd", n)), by.get(("miniflex-cpu", n))) for n in rounds]
    pairs = [(s, c) for s, c in pairs if s and c and c.get("out_tok_s")]
    if not pairs or not all(s.get("makespan_s") and c.get("makespan_s") for s, c in pairs):
        return {}
    each = [s["out_tok_s"] / c["out_tok_s"] for s, c in pairs]
    total = _rate([s for s, _ in pairs]) / _rate([c for _, c in pairs])
    lines.append(
        f"miniflex-ssd over all {len(pairs)} rounds: {total:.2f}x miniflex-cpu's output "
        f"tokens/s (by round: {', '.join(f'{x:.2f}x' for x in each)})"
    )
    return {
        "ssd_vs_cpu_all_rounds_x": round(total, 3),
        "ssd_vs_cpu_by_round_x": [round(x, 3) for x in each],
    }


def _rate(rounds: list[dict[str, Any]]) -> float:
    """Output tokens/s over ``rounds`` together: their tokens over their makespans."""
    tokens = sum(r["out_tok_s"] * r["makespan_s"] for r in rounds)
    return tokens / sum(r["makespan_s"] for r in rounds)


def _round_row(config: str, round_: int, ss: list[Sample], makespan: float) -> dict[str, Any]:
    ttft = [s.ttft_ms for s in ss]
    prompt = sum(s.prompt_tokens for s in ss)
    cached = sum(s.cached_tokens or 0 for s in ss)
    tiers: Counter[str] = Counter()
    for s in ss:
        tiers.update(s.tiers)
    return {
        "config": config,
        "round": round_,
        "requests": len(ss),
        "makespan_s": round(makespan, 2),
        "out_tok_s": round(sum(s.output_tokens for s in ss) / makespan, 1) if makespan else 0.0,
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p99_ms": percentile(ttft, 99),
        "cached_tokens": cached,
        "cached_pct": round(100 * cached / prompt, 1) if prompt else 0.0,
        "tiers": ",".join(f"{t}={n}" for t, n in sorted(tiers.items())) or "-",
    }
