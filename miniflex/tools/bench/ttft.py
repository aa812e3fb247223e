"""``miniflex bench ttft``: TTFT of a long prompt, cold and after vLLM evicted it.

Per prompt length (default about 1k, 8k and 30k tokens) and repeat, each with
a fresh prompt A:

1. **cold**: A, nothing cached anywhere;
2. **GPU hit**: A again at once, served by vLLM's own prefix cache;
3. vLLM's copy is evicted (offline ``reset_prefix_cache()``; against a server,
   unique fillers worth 1.5x its KV capacity). With ``push_tokens`` (``--ttft-evict
   cpu``), unique filler prompts of that many tokens in all are prefilled first:
   they push A out of a CPU tier too small to hold them, so that A is left only
   on the SSD tier (or, for APC alone, nowhere);
4. **evicted**: A again, now served by the tier under test (APC alone
   recomputes it); with ``settle_s`` (``--ttft-settle``) that many seconds
   later, so that the disk has written what the fillers left first.

The physical floor of step 4 is ``KV bytes of A / copy bandwidth + GPU-hit
TTFT``: the bytes have to cross the host-to-device link (pinned H2D measured
in the same run; memcpy on the CPU backend), and the rest of the request
costs what a full GPU hit costs. ``x_floor`` is the evicted TTFT over it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from miniflex.tools.bench.bandwidth import kv_copy_ms
from miniflex.tools.bench.base import WARMUP_TOKENS, Log, Workload
from miniflex.tools.bench.driver import Driver
from miniflex.tools.bench.engines import Measure
from miniflex.tools.bench.model import PromptMaker
from miniflex.tools.bench.samples import Sample

__all__ = ["TTFTWorkload"]


@dataclass
class TTFTWorkload(Workload):
    name: ClassVar[str] = "ttft"
    title: ClassVar[str] = "TTFT: cold, vLLM prefix-cache hit, and after vLLM evicted the prompt"
    row_cases = ("prompt_tokens",)
    row_measures = (Measure("evicted_ms"), Measure("gpu_hit_ms"), Measure("cold_ms"))

    prompts: PromptMaker
    prompt_tokens: tuple[int, ...] = (1024, 8192, 30000)
    repeat: int = 1
    kv_bytes_per_token: int | None = None
    bandwidth_gbps: float | None = None
    bandwidth_kind: str = "pinned H2D"
    push_tokens: int = 0
    """Unique filler tokens prefilled before each eviction (0: vLLM's copy only)."""
    settle_s: float = 0.0
    """Seconds waited after the eviction, before the evicted prompt (the disk drains)."""

    def max_prompt_tokens(self) -> int:
        return max(self.prompt_tokens)

    def working_set_tokens(self, capacity_tokens: int) -> int:
        return max(self.prompt_tokens)  # one prompt is reused at a time

    def params(self) -> dict[str, Any]:
        return {
            "prompt_tokens": list(self.prompt_tokens),
            "repeat": self.repeat,
            "bandwidth_GBps": self.bandwidth_gbps,
            "bandwidth_kind": self.bandwidth_kind,
            "push_tokens": self.push_tokens,
            "settle_s": self.settle_s,
        }

    def run(self, driver: Driver, log: Log) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        driver.prefill(self.prompts(WARMUP_TOKENS, "warmup"), "warmup")
        rows, samples = [], []
        for n in self.prompt_tokens:
            runs: list[tuple[Sample, Sample, Sample]] = []
            for r in range(self.repeat):
                a = self.prompts(n, "ttft", n, r)
                cold = driver.prefill(a, "cold")
                gpu = driver.prefill(a, "gpu-hit")
                self._push(driver, log, f"{n}-{r}")
                driver.evict_gpu()
                time.sleep(self.settle_s)
                hit = driver.prefill(a, "evicted")
                runs.append((cold, gpu, hit))
                samples += [dict(s.as_dict(), repeat=r) for s in (cold, gpu, hit)]
                log(
                    f"{driver.name}: {n} tokens #{r}: cold {cold.ttft_ms:.1f} ms, GPU hit "
                    f"{gpu.ttft_ms:.1f} ms, evicted {hit.ttft_ms:.1f} ms "
                    f"(vLLM hit {hit.vllm_hit_tokens}, connector hit {hit.external_tokens})"
                )
            rows.append(self._row(driver.name, n, runs))
        return rows, samples

    def _push(self, driver: Driver, log: Log, tag: str) -> None:
        """Prefill ``push_tokens`` of unique fillers, each at most as long as the longest prompt."""
        size = max(self.prompt_tokens)
        left, k = self.push_tokens, 0
        if left:
            log(f"{driver.name}: {left} filler tokens to push the prompt out of the CPU tiers")
        while left > 0:
            driver.prefill(
                self.prompts(min(size, max(left, WARMUP_TOKENS)), "push", tag, k), "push"
            )
            left -= size
            k += 1

    def _row(self, config: str, n: int, runs: list[tuple[Sample, Sample, Sample]]) -> dict:
        cold, gpu, hit = (statistics.median(r[i].ttft_ms for r in runs) for i in range(3))
        last = runs[-1][2]
        floor = self.floor_ms(n, gpu)
        return {
            "config": config,
            "prompt_tokens": n,
            "cold_ms": round(cold, 1),
            "gpu_hit_ms": round(gpu, 1),
            "evicted_ms": round(hit, 1),
            "speedup": round(cold / hit, 2) if hit else None,
            "vllm_hit": last.vllm_hit_tokens,
            "ext_hit": last.external_tokens,
            "tiers": _per_tier(last.tiers),
            "resident": _per_tier(last.resident),
            "load": last.load or "-",
            "floor_ms": None if floor is None else round(floor, 1),
            "x_floor": None if not floor else round(hit / floor, 2),
            "same_token": all(r[0].first_token == r[2].first_token for r in runs),
        }

    def floor_ms(self, n: int, gpu_hit_ms: float) -> float | None:
        copy = kv_copy_ms(n, self.kv_bytes_per_token, self.bandwidth_gbps)
        return None if copy is None else copy + gpu_hit_ms

    def summary(self, rows: list[dict[str, Any]], context: dict[str, Any]) -> dict[str, Any]:
        apc = {r["prompt_tokens"]: r["evicted_ms"] for r in rows if r["config"] == "apc"}
        vs_apc = {
            f"{r['config']}@{r['prompt_tokens']}": round(
                apc[r["prompt_tokens"]] / r["evicted_ms"], 2
            )
            for r in rows
            if r["config"] != "apc" and r["prompt_tokens"] in apc and r["evicted_ms"]
        }
        lines = [
            f"{k}: evicted-prompt TTFT {v}x faster than APC's recompute" for k, v in vs_apc.items()
        ]
        if self.bandwidth_gbps is None:
            lines.append("floor n/a: the copy bandwidth could not be measured")
        else:
            lines.append(
                f"floor = KV bytes / {self.bandwidth_gbps} GB/s ({self.bandwidth_kind}, measured "
                "in this run) + vLLM GPU-hit TTFT; x_floor = evicted TTFT / floor"
            )
        return {"speedup_vs_apc": vs_apc, "lines": lines}

    def draw(self, plt: Any, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
        sizes = list(dict.fromkeys(r["prompt_tokens"] for r in rows))
        fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 3.8), squeeze=False)
        for ax, n in zip(axes[0], sizes, strict=True):
            sub = [r for r in rows if r["prompt_tokens"] == n]
            xs = range(len(sub))
            for k, (key, label) in enumerate(
                (("cold_ms", "cold"), ("gpu_hit_ms", "vLLM GPU hit"), ("evicted_ms", "evicted"))
            ):
                ax.bar([x + (k - 1) * 0.27 for x in xs], [r[key] for r in sub], 0.27, label=label)
            for x, r in zip(xs, sub, strict=True):
                if r["floor_ms"]:
                    ax.hlines(r["floor_ms"], x - 0.4, x + 0.4, colors="k", linestyles="dashed")
            ax.set_xticks(list(xs), [r["config"] for r in sub], rotation=20)
            ax.set_title(f"{n} tokens (dashed: floor)")
            ax.set_ylabel("TTFT ms")
        axes[0][0].legend(fontsize=8)
        fig.suptitle(self.title, fontsize=10)


def _per_tier(tokens: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(tokens.items())) or "-"
