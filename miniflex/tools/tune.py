"""``miniflex tune``: time the movers on a model's KV layout and remember the fastest.

Usable from Python (a notebook) as well as from the command line::

    from miniflex.tools.tune import tune
    results = tune("bench/models/qwen3-8b-shape", chunk_tokens=(64, 128))
    results[0].winner.candidate   # Candidate(mover='kernel', ctas=16, vec=16)

For each chunk size it builds a synthetic KV cache of that shape on the GPU
and a pinned pool, times every candidate (kernel mover per CTA count and
vector width, the staged and DMA movers, and the torch mover as a reference) on the same
random non-contiguous chunks, and stores the winner in the tuning cache
(:mod:`miniflex.gpu.tune_cache`) under this GPU, layout and chunk size.

The winner is the fastest by the harmonic mean of store and load bandwidth,
except that a candidate within ``TOLERANCE`` of it that costs fewer SMs is
preferred: DMA (no SMs) first, then staged (SMs only for on-GPU page
moves), then the kernel with the fewest CTAs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from miniflex.config import MiniFlexConfig, default_tune_cache
from miniflex.errors import TransferError
from miniflex.gpu import pinning
from miniflex.gpu.base import KVMover
from miniflex.gpu.cpu_mover import TorchMover
from miniflex.gpu.kernel_mover import DEFAULT_CTAS
from miniflex.gpu.registry import cuda_mover_problem
from miniflex.gpu.synthetic import kv_geometry, load_model_config, random_chunks
from miniflex.gpu.synthetic import synthetic_caches as make_caches
from miniflex.gpu.tune_cache import TuneChoice, tune_key, write_choice
from miniflex.layout import KVGeometry, KVLayout, layout_from_tensors
from miniflex.plan import ChunkMove
from miniflex.pool import HostPool
from miniflex.tools.table import format_table

__all__ = [
    "TOLERANCE",
    "Candidate",
    "Timing",
    "TuneResult",
    "command",
    "default_candidates",
    "median_seconds",
    "pick_winner",
    "time_mover",
    "tune",
]

TOLERANCE = 0.03
CTAS_SWEEP = (2, 4, 8, 16, 32)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Candidate:
    """One mover with its parameters (``ctas``/``vec`` only for the kernel; ``lane_stores``
    only for the staged mover: its stores through the lanes, as ``staging_stores=lanes``)."""

    mover: str
    ctas: int | None = None
    vec: int | None = None
    lane_stores: bool = False

    @classmethod
    def named(cls, name: str) -> Candidate:
        """A mover name as the benchmarks take it: a registry name, or ``staged-lanes``."""
        return cls("staged", lane_stores=True) if name == "staged-lanes" else cls(name)

    @property
    def label(self) -> str:
        if self.mover == "kernel":
            return f"kernel ctas={self.ctas} vec={self.vec or 'auto'}"
        if self.lane_stores:
            return "staged-lanes"
        return "torch (reference)" if self.mover == "cpu" else self.mover

    @property
    def sm_cost(self) -> float:
        """Order of preference among near-equals: SMs taken from vLLM's compute, for as
        long as a copy lasts. The staged mover's lanes take theirs only for each lane's
        gather or scatter (1); its default direct stores hold the kernel's CTAs for the
        whole store, as the kernel mover does (``ctas``, else :data:`DEFAULT_CTAS`)."""
        if self.mover == "staged":
            return 1.0 if self.lane_stores else float(self.ctas or DEFAULT_CTAS)
        costs = {"dma": 0.0, "kernel": float(self.ctas or 0)}
        return costs.get(self.mover, float("inf"))

    def build(self, layout: KVLayout, kv: dict[str, torch.Tensor], pool: HostPool) -> KVMover:
        if self.mover == "cpu":
            return TorchMover(layout, kv, pool)
        if self.mover == "kernel":
            from miniflex.gpu.kernel_mover import KernelMover

            return KernelMover(layout, kv, pool, ctas=self.ctas, vec=self.vec)
        if self.mover == "staged":
            from miniflex.gpu.staged_mover import StagedMover

            return StagedMover(layout, kv, pool, ctas=self.ctas, direct_stores=not self.lane_stores)
        if self.mover != "dma":
            raise ValueError(f"no mover named {self.mover!r}")
        from miniflex.gpu.dma_mover import DMAMover

        return DMAMover(layout, kv, pool)


@dataclass(frozen=True)
class Timing:
    candidate: Candidate
    store_gbps: float
    load_gbps: float

    @property
    def gbps(self) -> float:
        """Harmonic mean: the rate of moving the same bytes out and back in."""
        return 2 / (1 / self.store_gbps + 1 / self.load_gbps)


@dataclass(frozen=True)
class TuneResult:
    key: str
    timings: tuple[Timing, ...]
    winner: Timing
    choice: TuneChoice


def default_candidates(ctas: Sequence[int] = CTAS_SWEEP, vecs: Sequence[int] = (16, 8)):
    """Kernel for each CTA count and vector width, staged, DMA, and torch as the reference."""
    kernels = [Candidate("kernel", c, v) for v in vecs for c in ctas]
    return [*kernels, Candidate("staged"), Candidate("dma"), Candidate("cpu")]


def time_mover(mover: KVMover, chunks: Sequence[ChunkMove], repeat: int) -> tuple[float, float]:
    """Median seconds of ``store(chunks)`` and of ``load(chunks)``, each call waited for."""
    return (
        median_seconds(lambda: mover.store(chunks), repeat),
        median_seconds(lambda: mover.load(chunks), repeat),
    )


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``repeat`` calls of ``fn`` (which must wait for its work), after
    one warm-up call (compilation, first touch)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def pick_winner(timings: Sequence[Timing], tolerance: float = TOLERANCE) -> Timing:
    """The cheapest (in SMs) of the timings within ``tolerance`` of the fastest."""
    best = max(t.gbps for t in timings)
    near = [t for t in timings if t.gbps >= (1 - tolerance) * best]
    return min(near, key=lambda t: (t.candidate.sm_cost, -t.gbps))


def tune(
    model: str | Path | dict,
    *,
    block_size: int = 16,
    dtype: str = "bfloat16",
    chunk_tokens: Sequence[int] = (64,),
    order: str = "LBHNC",
    tensor_parallel: int = 1,
    tokens_per_call: int = 1024,
    repeat: int = 10,
    candidates: Sequence[Candidate] | None = None,
    cache_path: str | Path | None = None,
    progress: Progress | None = None,
) -> list[TuneResult]:
    """Time ``candidates`` for each chunk size; write winners to ``cache_path`` if given.

    ``model`` is a ``config.json`` (or its directory) or the parsed dict. Each
    timed call moves ``tokens_per_call`` tokens (at least one chunk) of
    random blocks to or from random slots.
    """
    if not torch.cuda.is_available():
        raise TransferError("tuning times the GPU movers and needs a CUDA GPU; torch sees none")
    cfg = model if isinstance(model, dict) else load_model_config(model)
    say = progress or (lambda msg: print(f"[miniflex tune] {msg}", file=sys.stderr, flush=True))
    results = []
    for tokens in chunk_tokens:
        g = kv_geometry(cfg, block_size, dtype, tokens, tensor_parallel)
        key, timings = _time_chunk_size(
            g, order, tokens_per_call, repeat, candidates or default_candidates(), say
        )
        winner, choice = _choose(timings)
        if cache_path is not None:
            write_choice(cache_path, key, choice)
        results.append(TuneResult(key, tuple(timings), winner, choice))
    return results


def _time_chunk_size(
    g: KVGeometry,
    order: str,
    tokens_per_call: int,
    repeat: int,
    candidates: Sequence[Candidate],
    say: Progress,
) -> tuple[str, list[Timing]]:
    """The tuning key of geometry ``g`` and the timings of ``candidates`` on it."""
    n_chunks = max(1, tokens_per_call // g.chunk_tokens)
    num_blocks = max(1024, 4 * n_chunks * g.blocks_per_chunk)
    kv = make_caches(g, order, num_blocks, "cuda", fill=False)
    layout = layout_from_tensors(kv, g.blocks_per_chunk)
    pool = HostPool(2 * n_chunks, g.slot_bytes)
    pinning.pin(pool.address, pool.nbytes, mapped=True)
    try:
        chunks = random_chunks(
            n_chunks, g.blocks_per_chunk, num_blocks, 2 * n_chunks, random.Random(0)
        )
        key = tune_key(torch.cuda.get_device_name(), layout)
        say(f"{key}: {n_chunks} chunks ({n_chunks * g.chunk_bytes / 2**20:.0f} MiB) a call")
        timings = _time_all(candidates, layout, kv, pool, chunks, repeat, say)
    finally:
        pinning.unpin(pool.address)
        pool.close()
        del kv
    if not timings:
        raise TransferError("no mover could be timed here (see the messages above)")
    return key, timings


def _choose(timings: Sequence[Timing]) -> tuple[Timing, TuneChoice]:
    """The winner, and what the cache keeps of it (with the best kernel's settings)."""
    winner = pick_winner(timings)
    kernels = [t for t in timings if t.candidate.mover == "kernel"]
    best_kernel = pick_winner(kernels).candidate if kernels else Candidate("kernel")
    choice = TuneChoice(
        winner.candidate.mover,
        best_kernel.ctas,
        best_kernel.vec,
        round(winner.store_gbps, 2),
        round(winner.load_gbps, 2),
    )
    return winner, choice


def _time_all(candidates, layout, kv, pool, chunks, repeat, say) -> list[Timing]:
    nbytes = sum(len(c.block_ids) for c in chunks) * layout.geometry.num_layers
    nbytes *= layout.geometry.page_bytes
    timings = []
    for cand in candidates:
        problem = cuda_mover_problem(cand.mover, True) if cand.mover != "cpu" else None
        if problem:
            say(f"{cand.label}: skipped, {problem}")
            continue
        try:
            mover = cand.build(layout, kv, pool)
        except TransferError as exc:  # e.g. a vector width this layout's alignment forbids
            say(f"{cand.label}: skipped, {exc}")
            continue
        t_store, t_load = time_mover(mover, chunks, repeat)
        timing = Timing(cand, nbytes / t_store / 1e9, nbytes / t_load / 1e9)
        say(f"{cand.label}: store {timing.store_gbps:.1f} GB/s, load {timing.load_gbps:.1f} GB/s")
        timings.append(timing)
    return timings


def result_rows(result: TuneResult) -> list[dict[str, object]]:
    """One table row per timing, the winner marked."""
    return [
        {
            "mover": t.candidate.label,
            "store GB/s": round(t.store_gbps, 2),
            "load GB/s": round(t.load_gbps, 2),
            "both GB/s": round(t.gbps, 2),
            "": "<- winner" if t is result.winner else "",
        }
        for t in result.timings
    ]


def print_results(results: Sequence[TuneResult], saved_to: str | None) -> None:
    for r in results:
        print(r.key)
        print(format_table(result_rows(r)))
        print(
            f"winner: {r.winner.candidate.label}" + (f" (saved to {saved_to})" if saved_to else "")
        )
        print()


def command(args: argparse.Namespace) -> int:
    """``miniflex tune``: see ``miniflex tune --help`` (the parser is in miniflex/tools/cli.py)."""
    cache = None
    if not args.no_save:
        cache = args.cache or MiniFlexConfig.from_dict().tune_cache or default_tune_cache()
    results = tune(
        args.model,
        block_size=args.block_size,
        dtype=args.dtype,
        chunk_tokens=args.chunk_tokens,
        order=args.order,
        tensor_parallel=args.tensor_parallel,
        tokens_per_call=args.tokens_per_call,
        repeat=args.repeat,
        candidates=default_candidates(args.ctas or CTAS_SWEEP),
        cache_path=cache,
    )
    print_results(results, cache)
    return 0
