"""A vLLM stand-in for the benchmark code: an LRU prefix cache of blocks plus an optional tier.

It follows the rules the workloads rely on (a prompt's blocks are cached after
it ran, the least recently used block goes first, the last prompt token is
always recomputed) with a synthetic TTFT of 1 ms plus 0.01 ms per recomputed
token, so workloads, runner, JSON and plots can be tested without an engine.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from miniflex.tools.bench.driver import Arrival, Driver
from miniflex.tools.bench.samples import Sample

BLOCK = 16


class FakeDriver(Driver):
    def __init__(self, name: str, capacity_tokens: int, tier: bool) -> None:
        self.name = name
        self.capacity_tokens = capacity_tokens
        self.gpu: OrderedDict[tuple[int, ...], None] = OrderedDict()
        self.tier: set[tuple[int, ...]] | None = set() if tier else None
        self.closed = False

    def _blocks(self, tokens: Sequence[int]) -> list[tuple[int, ...]]:
        return [tuple(tokens[: (i + 1) * BLOCK]) for i in range(len(tokens) // BLOCK)]

    def _serve(self, tokens: Sequence[int], label: str, at: float, max_tokens: int) -> Sample:
        blocks = self._blocks(tokens)
        usable = (len(tokens) - 1) // BLOCK
        gpu = 0
        while gpu < usable and blocks[gpu] in self.gpu:
            gpu += 1
        ext = gpu
        while self.tier is not None and ext < usable and blocks[ext] in self.tier:
            ext += 1
        for b in blocks:
            self.gpu[b] = None
            self.gpu.move_to_end(b)
            if self.tier is not None:
                self.tier.add(b)
        while len(self.gpu) > self.capacity_tokens // BLOCK:
            self.gpu.popitem(last=False)
        ms = 1.0 + 0.01 * (len(tokens) - ext * BLOCK)
        return Sample(
            label=label,
            prompt_tokens=len(tokens),
            ttft_ms=ms,
            e2e_ms=ms + max_tokens - 1,
            output_tokens=max_tokens,
            arrival_s=at,
            cached_tokens=ext * BLOCK,
            external_tokens=(ext - gpu) * BLOCK if self.tier is not None else 0,
            tiers={"cpu": (ext - gpu) * BLOCK} if self.tier is not None else {},
            first_token=len(tokens) % 7,
        )

    def prefill(self, tokens: Sequence[int], label: str) -> Sample:
        return self._serve(tokens, label, 0.0, 1)

    def open_loop(self, arrivals: Sequence[Arrival]) -> tuple[list[Sample], float]:
        out = [self._serve(a.tokens, a.label, a.at_s, a.max_tokens) for a in arrivals]
        return out, max(a.at_s for a in arrivals) + 0.05

    def evict_gpu(self) -> None:
        self.gpu.clear()

    def reset(self) -> bool:
        self.gpu.clear()
        if self.tier is not None:
            self.tier.clear()
        return True

    def close(self) -> None:
        self.closed = True
