"""A synthetic workload through the real core: keys, index, CPU tier, pool and mover.

No vLLM here: a small vLLM-shaped paged KV cache is filled with bytes derived
from each prompt's tokens ("prefill"), stored chunk by chunk into the CPU tier,
and loaded back into other blocks, and every loaded page is compared with what
the prefill produced. Used by ``miniflex demo --synthetic`` and the tests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from miniflex.gpu.cpu_mover import TorchMover
from miniflex.keys import Namespace, chunk_keys_from_tokens
from miniflex.layout import layout_from_tensors
from miniflex.plan import ChunkMove
from miniflex.pool import HostPool
from miniflex.tiers import SlotTier
from miniflex.types import BlockId, Tier

__all__ = ["PhaseResult", "run_core_demo"]

LAYERS, HEADS, BLOCK, HEAD, BPC = 4, 2, 32, 64, 2


@dataclass(frozen=True)
class PhaseResult:
    phase: str
    prompts: int
    chunks: int
    hit_chunks: int
    bytes_stored: int
    bytes_loaded: int
    verified_pages: int
    seconds: float

    @property
    def hit_rate(self) -> float:
        return self.hit_chunks / self.chunks if self.chunks else 0.0


class _Engine:
    """A toy engine with a paged cache of one prompt's size; enough to move real bytes."""

    def __init__(self, chunks_per_prompt: int, cpu_slots: int) -> None:
        self.blocks = chunks_per_prompt * BPC
        self.cache = {
            f"layer{i}": torch.zeros(self.blocks, HEADS, BLOCK, 2 * HEAD, dtype=torch.float16)
            for i in range(LAYERS)
        }
        self.layout = layout_from_tensors(self.cache, BPC)
        g = self.layout.geometry
        self.ns = Namespace("synthetic", g.dtype, self.layout.name, LAYERS, HEADS, HEAD, BLOCK, BPC)
        self.tier = SlotTier(Tier.CPU, cpu_slots)
        self.pool = HostPool(cpu_slots, g.slot_bytes)
        self.mover = TorchMover(self.layout, self.cache, self.pool)

    @staticmethod
    def prefill_pages(key: int) -> torch.Tensor:
        """The KV a real prefill would produce for a chunk: a function of its prefix (key)."""
        gen = torch.Generator().manual_seed(key % 2**63)
        return torch.randn(LAYERS, BPC, HEADS, BLOCK, 2 * HEAD, generator=gen).half()

    def serve(self, tokens: np.ndarray) -> tuple[int, int, int, int, int]:
        """One request: load the hit prefix, 'compute' the rest, store new chunks."""
        keys = chunk_keys_from_tokens(self.ns, tokens.tolist())
        hit = self.tier.match(keys)
        blocks = [BlockId(b) for b in np.random.default_rng(hit).permutation(self.blocks)]
        moves = [
            ChunkMove(s, tuple(blocks[i * BPC : (i + 1) * BPC]))
            for i, s in enumerate(self.tier.prepare_load(keys[:hit]))
        ]
        loaded = self.mover.load(moves)
        self.tier.complete_load([m.slot for m in moves], ok=True)
        verified = 0
        for i in range(len(keys)):
            want = self.prefill_pages(keys[i])
            for layer, t in enumerate(self.cache.values()):
                idx = torch.tensor(blocks[i * BPC : (i + 1) * BPC])
                if i < hit:  # loaded: must equal what the prefill produced
                    assert torch.equal(t[idx], want[layer]), f"chunk {i} layer {layer} differs"
                    verified += BPC
                else:
                    t[idx] = want[layer]
        placed = self.tier.prepare_store(keys[hit:])
        slot_of = dict(placed)
        stores = [
            ChunkMove(slot_of[k], tuple(blocks[(hit + i) * BPC : (hit + i + 1) * BPC]))
            for i, k in enumerate(keys[hit:])
            if k in slot_of
        ]
        stored = self.mover.store(stores)
        self.tier.complete_store(placed, ok=True)
        return len(keys), hit, stored, loaded, verified


def run_core_demo(prompts: int, chunks_per_prompt: int, cpu_slots: int) -> list[PhaseResult]:
    """Cold pass, warm pass, then a working set larger than the tier; prints a table."""
    eng = _Engine(chunks_per_prompt, cpu_slots)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 32000, (prompts, chunks_per_prompt * BPC * BLOCK), dtype=np.int64)
    fit = max(1, min(prompts, cpu_slots // chunks_per_prompt))
    over = min(prompts, 2 * fit)
    results = []
    print(
        f"MiniFlex core demo: {LAYERS} layers, chunk {eng.layout.geometry.chunk_bytes} B, "
        f"{cpu_slots} CPU slots ({fit} prompts fit)",
        flush=True,
    )
    for phase, rows in (
        ("cold", range(fit)),
        ("repeat", range(fit)),
        ("over-capacity x2", [*range(over), *range(over)]),
    ):
        t0 = time.perf_counter()
        totals = np.zeros(5, dtype=np.int64)
        for r in rows:
            totals += eng.serve(tokens[r])
        results.append(PhaseResult(phase, len(rows), *map(int, totals), time.perf_counter() - t0))
        print(f"  {phase}: done", flush=True)
    _print_table(results)
    eng.pool.close()
    return results


def _print_table(results: list[PhaseResult]) -> None:
    head = (
        f"{'phase':<18}{'prompts':>8}{'chunks':>8}{'CPU hits':>10}{'hit %':>7}"
        f"{'MiB stored':>12}{'MiB loaded':>12}{'pages verified':>16}"
    )
    print(head)
    for r in results:
        print(
            f"{r.phase:<18}{r.prompts:>8}{r.chunks:>8}{r.hit_chunks:>10}{100 * r.hit_rate:>6.0f}%"
            f"{r.bytes_stored / 2**20:>12.1f}{r.bytes_loaded / 2**20:>12.1f}{r.verified_pages:>16}"
        )
