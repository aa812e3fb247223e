"""``miniflex bench multiturn``: a conversation's next turn after its history left the GPU.

Per repeat, with a fresh conversation:

1. **turn 1**: a prefix of ``prefix_tokens`` (the history), nothing cached;
2. vLLM's copy is evicted (offline ``reset_prefix_cache()``; against a server,
   fillers worth 1.5x its KV capacity), so the history is only in the tier;
3. **turn 2**: the history plus ``new_tokens`` new tokens. Its TTFT is the
   measurement: APC alone recomputes everything; MiniFlex loads the history
   from its CPU tier and computes the new tokens.

The MiniFlex configurations differ only in ``load_mode``: ``sync`` (the whole
load, then the forward), ``layerwise`` (layer L+1 copies while layer L
computes, in the same step) and ``async`` (the load, then the forward in a
later engine step). The summary gives the ratios layerwise/sync,
layerwise/async and layerwise/recompute of turn 2's TTFT.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, ClassVar

from miniflex.tools.bench.base import WARMUP_TOKENS, Log, Workload
from miniflex.tools.bench.driver import Driver
from miniflex.tools.bench.engines import Measure
from miniflex.tools.bench.model import PromptMaker

__all__ = ["MultiturnWorkload"]

RATIOS = (("layerwise", "sync"), ("layerwise", "async"), ("layerwise", "recompute"))
CONFIG_OF = {
    "layerwise": "miniflex-layerwise",
    "sync": "miniflex-sync",
    "async": "miniflex-async",
    "recompute": "apc",
}


@dataclass
class MultiturnWorkload(Workload):
    name: ClassVar[str] = "multiturn"
    title: ClassVar[str] = "Next turn of a conversation whose history vLLM evicted"
    row_cases = ("prefix_tokens", "new_tokens")
    row_measures = (Measure("turn2_ms"), Measure("turn1_ms"))

    prompts: PromptMaker
    prefix_tokens: int = 20000
    new_tokens: int = 4096
    repeat: int = 1

    def max_prompt_tokens(self) -> int:
        return self.prefix_tokens + self.new_tokens

    def working_set_tokens(self, capacity_tokens: int) -> int:
        return self.prefix_tokens + self.new_tokens  # one conversation at a time

    def params(self) -> dict[str, Any]:
        return {
            "prefix_tokens": self.prefix_tokens,
            "new_tokens": self.new_tokens,
            "repeat": self.repeat,
        }

    def run(self, driver: Driver, log: Log) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        driver.prefill(self.prompts(WARMUP_TOKENS, "warmup"), "warmup")
        firsts, turns, samples = [], [], []
        for r in range(self.repeat):
            history = self.prompts(self.prefix_tokens, "multiturn-history", r)
            turn = [*history, *self.prompts(self.new_tokens, "multiturn-turn", r)]
            first = driver.prefill(history, "turn1")
            driver.evict_gpu()
            second = driver.prefill(turn, "turn2")
            firsts.append(first)
            turns.append(second)
            samples += [dict(s.as_dict(), repeat=r) for s in (first, second)]
            log(
                f"{driver.name}: #{r}: turn 1 {first.ttft_ms:.1f} ms, turn 2 "
                f"{second.ttft_ms:.1f} ms (vLLM hit {second.vllm_hit_tokens}, connector hit "
                f"{second.external_tokens})"
            )
        last = turns[-1]
        row = {
            "config": driver.name,
            "prefix_tokens": self.prefix_tokens,
            "new_tokens": self.new_tokens,
            "turn1_ms": round(statistics.median(s.ttft_ms for s in firsts), 1),
            "turn2_ms": round(statistics.median(s.ttft_ms for s in turns), 1),
            "vllm_hit": last.vllm_hit_tokens,
            "ext_hit": last.external_tokens,
            "tiers": " ".join(f"{k}={v}" for k, v in sorted(last.tiers.items())) or "-",
        }
        return [row], samples

    def summary(self, rows: list[dict[str, Any]], context: dict[str, Any]) -> dict[str, Any]:
        ttft = {r["config"]: r["turn2_ms"] for r in rows}
        ratios: dict[str, float | None] = {}
        lines = []
        for a, b in RATIOS:
            x, y = ttft.get(CONFIG_OF[a]), ttft.get(CONFIG_OF[b])
            ratios[f"{a}/{b}"] = round(x / y, 3) if x and y else None
            if x and y:
                lines.append(f"turn-2 TTFT {a}/{b} = {x:.1f}/{y:.1f} ms = {x / y:.3f}")
        return {"turn2_ms": ttft, "ratios": ratios, "lines": lines}

    def draw(self, plt: Any, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        xs = range(len(rows))
        ax.bar(list(xs), [r["turn2_ms"] for r in rows], 0.6)
        ax.set_xticks(list(xs), [r["config"] for r in rows], rotation=20)
        ax.set_ylabel("turn-2 TTFT ms")
        ax.set_title(f"{self.prefix_tokens} history + {self.new_tokens} new tokens", fontsize=9)
        fig.suptitle(self.title, fontsize=10)
