"""``miniflex bench overflow``: a working set larger than vLLM's KV cache, sent round-robin.

For each ratio R (default 0.5 to 3), K = R x capacity / P distinct prompts of
P tokens are sent in turn, ``passes`` times (the first pass only fills the
caches). A request of a later pass is a **miss** when it got no more cached
tokens than the same prompt got cold in pass 1. vLLM's own hits and the
connector's (MiniFlex or native) are reported apart.

What it shows: APC's LRU keeps nothing of a cycle longer than its capacity,
so past R = 1 every APC request misses; a tier that holds the working set
stays flat. Offline, caches are reset between ratios; against a server each
ratio uses fresh prompts instead.

How flat a tier can stay is bounded by the link: a hit past capacity copies the
prompt's KV back (``prompt_tokens x KV bytes per token / copy bandwidth``, the
bandwidth measured in the run, as for ``ttft``), so its TTFT is at best the
in-capacity p50 plus that copy. The summary gives this floor beside the flatness
target and how far above the floor each configuration's worst p50 is.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, ClassVar

from miniflex.tools.bench.bandwidth import kv_copy_ms
from miniflex.tools.bench.base import WARMUP_TOKENS, Log, Workload
from miniflex.tools.bench.driver import Driver
from miniflex.tools.bench.engines import Measure
from miniflex.tools.bench.model import PromptMaker
from miniflex.tools.bench.samples import Sample, mean

__all__ = ["OverflowWorkload"]

FLAT_TARGET = 1.3  # worst TTFT past capacity / TTFT within it


@dataclass
class OverflowWorkload(Workload):
    name: ClassVar[str] = "overflow"
    title: ClassVar[str] = "Working set vs vLLM's KV capacity, prompts sent round-robin"
    row_cases = ("ratio",)
    row_measures = (Measure("ttft_p50_ms"), Measure("miss_pct"))

    prompts: PromptMaker
    prompt_tokens: int = 4096
    ratios: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0, 3.0)
    passes: int = 2
    kv_bytes_per_token: int | None = None
    bandwidth_gbps: float | None = None
    bandwidth_kind: str = "pinned H2D"

    def max_prompt_tokens(self) -> int:
        return self.prompt_tokens

    def working_set_tokens(self, capacity_tokens: int) -> int:
        return self.num_prompts(max(self.ratios), capacity_tokens) * self.prompt_tokens

    def num_prompts(self, ratio: float, capacity_tokens: int) -> int:
        return max(1, round(ratio * capacity_tokens / self.prompt_tokens))

    def params(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "ratios": list(self.ratios),
            "passes": self.passes,
            "bandwidth_GBps": self.bandwidth_gbps,
            "bandwidth_kind": self.bandwidth_kind,
        }

    def copy_ms(self) -> float | None:
        """Milliseconds to copy one prompt's KV at the measured bandwidth (None: unknown)."""
        return kv_copy_ms(self.prompt_tokens, self.kv_bytes_per_token, self.bandwidth_gbps)

    def run(self, driver: Driver, log: Log) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        driver.prefill(self.prompts(WARMUP_TOKENS, "warmup"), "warmup")
        rows, samples = [], []
        for i, ratio in enumerate(self.ratios):
            driver.reset()
            k = self.num_prompts(ratio, driver.capacity_tokens)
            prompts = [self.prompts(self.prompt_tokens, "overflow", i, j) for j in range(k)]
            cold: list[Sample] = []
            later: list[tuple[Sample, bool]] = []
            for p in range(self.passes):
                for j, tokens in enumerate(prompts):
                    s = driver.prefill(tokens, f"pass{p + 1}")
                    if p == 0:
                        cold.append(s)
                        miss = None
                    else:
                        miss = (s.cached_tokens or 0) <= (cold[j].cached_tokens or 0)
                        later.append((s, miss))
                    samples.append(dict(s.as_dict(), ratio=ratio, prompt=j, miss=miss))
            row = self._row(driver.name, ratio, k, driver.capacity_tokens, later)
            rows.append(row)
            log(
                f"{driver.name}: {row['working_set_x']}x capacity ({k} prompts): "
                f"miss {row['miss_pct']}%, TTFT p50 {row['ttft_p50_ms']} ms"
            )
        return rows, samples

    def _row(
        self, config: str, ratio: float, k: int, capacity: int, later: list[tuple[Sample, bool]]
    ) -> dict[str, Any]:
        ss = [s for s, _ in later]
        tiers: dict[str, int] = {}
        for s in ss:
            for t, n in s.tiers.items():
                tiers[t] = tiers.get(t, 0) + n
        return {
            "config": config,
            "ratio": ratio,
            "working_set_x": round(k * self.prompt_tokens / capacity, 2),
            "prompts": k,
            "requests": len(ss),
            "miss_pct": round(100 * sum(m for _, m in later) / len(later), 1) if later else None,
            "ttft_p50_ms": round(statistics.median(s.ttft_ms for s in ss), 1) if ss else None,
            "ttft_mean_ms": mean(s.ttft_ms for s in ss),
            "vllm_hit": mean(s.vllm_hit_tokens for s in ss),
            "ext_hit": mean(s.external_tokens for s in ss),
            "recomputed": mean(s.prompt_tokens - (s.cached_tokens or 0) for s in ss),
            "tiers": " ".join(f"{t}={n // max(1, len(ss))}" for t, n in sorted(tiers.items()))
            or "-",
        }

    def summary(self, rows: list[dict[str, Any]], context: dict[str, Any]) -> dict[str, Any]:
        """Per configuration: the worst miss rate past capacity, and how flat TTFT stays: the
        worst p50 past capacity over the median p50 within it (target: at most FLAT_TARGET),
        and over its floor (that median plus one prompt's copy, :meth:`copy_ms`)."""
        past, flat, floor_flat, x_floor = {}, {}, {}, {}
        copy = self.copy_ms()
        for config in dict.fromkeys(r["config"] for r in rows):
            mine = [r for r in rows if r["config"] == config]
            over = [r["miss_pct"] for r in mine if r["ratio"] > 1]
            if over and all(m is not None for m in over):
                past[config] = max(over)
            inside = [r["ttft_p50_ms"] for r in mine if r["ratio"] <= 1 and r["ttft_p50_ms"]]
            outside = [r["ttft_p50_ms"] for r in mine if r["ratio"] > 1 and r["ttft_p50_ms"]]
            if inside and outside:
                base = statistics.median(inside)
                flat[config] = round(max(outside) / base, 2)
                if copy is not None:
                    floor_flat[config] = round((base + copy) / base, 2)
                    x_floor[config] = round(max(outside) / (base + copy), 2)
        lines = [f"{c}: worst miss rate past capacity {m}%" for c, m in past.items()]
        lines += [
            f"{c}: worst TTFT p50 past capacity {x}x its in-capacity p50 (target: at most "
            f"{FLAT_TARGET}x, {'met' if x <= FLAT_TARGET else 'NOT met'})"
            + (
                f"; the copy allows no better than {floor_flat[c]}x: {x_floor[c]}x its floor"
                if c in floor_flat
                else ""
            )
            for c, x in flat.items()
        ]
        if copy is not None:
            lines.append(
                f"floor = in-capacity p50 + a {self.prompt_tokens}-token prompt's KV at "
                f"{self.bandwidth_gbps} GB/s ({self.bandwidth_kind}, measured in this run): "
                f"{copy:.1f} ms"
            )
        return {
            "worst_miss_pct_past_capacity": past,
            "flat_x": flat,
            "floor_flat_x": floor_flat,
            "x_floor": x_floor,
            "lines": lines,
        }

    def draw(self, plt: Any, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
        for config in dict.fromkeys(r["config"] for r in rows):
            sub = [r for r in rows if r["config"] == config]
            xs = [r["working_set_x"] for r in sub]
            ax1.plot(xs, [r["miss_pct"] for r in sub], marker="o", label=config)
            ax2.plot(xs, [r["ttft_mean_ms"] for r in sub], marker="o", label=config)
        for ax, label in ((ax1, "miss rate %"), (ax2, "mean TTFT ms")):
            ax.axvline(1.0, color="grey", linestyle=":")
            ax.set_xlabel("working set / vLLM KV capacity")
            ax.set_ylabel(label)
        ax1.set_ylim(-5, 105)
        ax1.legend(fontsize=8)
        fig.suptitle(f"{self.title} ({self.prompt_tokens}-token prompts)", fontsize=10)
