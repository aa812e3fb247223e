"""The cost model behind cost-aware hits: is loading a resident prefix faster than recomputing it?

A request of ``T`` prompt tokens whose first ``h`` tokens vLLM already holds has a run
of resident chunks after them, chunk ``i`` in tier ``t_i``. Loading the first ``L`` of
them (asynchronously: the load completes, then vLLM computes the rest) predicts::

    ttft(L) = sum_{i < L} load(t_i) + prefill(n = T - d, ctx = d)
    d = min(h + L * chunk_tokens, (T - 1) // block_size * block_size)   (the last token computes)
    load(CPU) = chunk_bytes / bandwidth[CPU]                  (CPU -> vLLM's cache)
    load(SSD | REMOTE) = chunk_bytes / bandwidth[tier] + load(CPU)   (read, then the same copy)
    prefill(n, ctx) = step + per_token * n + per_pair * n * (ctx + n / 2)

``per_pair`` is the attention term. :meth:`CostModel.choose` returns the ``L`` of least
predicted TTFT, never fewer than the leading chunks held in CPU. Bandwidths follow every
finished load (a moving average, per tier); the prefill coefficients are a least-squares
fit over the engine's recent steps (:meth:`CostModel.observe_step`), refitted every few.

Until enough steps were seen the model is *uncalibrated*: a hit held wholly in
CPU is loaded whole, and chunks in a slower tier (SSD, the remote store) are
priced against the mean seconds per token of the prefill steps seen so far,
so that a fresh engine does not read a store slower than its own prefill
(before any prefill step, everything resident is loaded).

With ``overlap`` (``load_mode=auto``) :meth:`CostModel.choose` also weighs
loading the leading CPU chunks *layerwise*, inside the step that computes the
rest of the prompt, against the best asynchronous load::

    layerwise = max(load, prefill) + load / num_layers     (layer 0's copy is exposed)
    async     = load + prefill + step                     (the request waits a step)

``step`` is the engine's recent step time (a moving average of observed
steps). A layerwise load also holds up every other request in its step: each
layer's attention waits for that layer's copy, so the step lasts
``layerwise`` rather than ``prefill``. With ``others`` requests running
beside it, the load goes layerwise only if what this request gains pays for
what they lose::

    layerwise + others * (layerwise - prefill) <= async

so under concurrent load (the engine busy with other requests) hits load
asynchronously, while the engine keeps computing, and an engine otherwise
idle overlaps the load with the prefill.

A layerwise load may also read SSD chunks (``instep``: as many leading chunks as
CPU slots can take), layer by layer while the step computes: its ``load`` is
then the longer of the disk's reads and the copies. Every prefix length is
weighed, since a split (load the head from SSD, recompute the tail beside it)
can beat both loading everything and recomputing it. Only the first step of
the rest overlaps the load: with ``step_tokens`` (vLLM's
``max_num_batched_tokens``), the tokens past it compute in later steps::

    layerwise(L) = max(load(L), prefill(first)) + load(L) / num_layers + prefill(after)

A layerwise load has a bandwidth of its own: it is issued layer by layer
through the mover's direct path, which can be much slower than a whole-slot
copy. Both CPU bandwidths start from the workers' start-up probe
(:mod:`miniflex.worker.probe`) and then follow real loads (a layerwise one
timed from issue to done, so a lower bound where the prefill was the longer
part). Uncalibrated (no prefill fit yet), a hit held wholly in CPU goes
layerwise when no other request runs. Example::

    model = CostModel(chunk_bytes=9 << 20, chunk_tokens=64)
    model.choose([Tier.CPU, Tier.SSD, Tier.SSD], prompt_tokens=8192, gpu_hit=0)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from miniflex.config import MiniFlexConfig
from miniflex.types import Tier

__all__ = ["CostModel", "Decision", "PrefillFit", "hit_cap", "make_cost_model"]

MIN_STEPS = 8
"""Prefill steps with at least :data:`MIN_TOKENS` tokens before the model is trusted."""
MIN_TOKENS = 256
WINDOW = 256
REFIT_EVERY = 8
EWMA = 0.3


@dataclass(frozen=True)
class PrefillFit:
    """``prefill(n, ctx) = step + per_token * n + per_pair * n * (ctx + n / 2)`` (seconds)."""

    step: float
    per_token: float
    per_pair: float

    def seconds(self, n: int, ctx: int) -> float:
        if n <= 0:
            return 0.0
        return self.step + self.per_token * n + self.per_pair * n * (ctx + n / 2)


@dataclass(frozen=True)
class Decision:
    """What :meth:`CostModel.choose` decided for one request (times in seconds)."""

    load_chunks: int
    resident_chunks: int
    predicted_s: float
    load_all_s: float
    recompute_s: float
    calibrated: bool
    layerwise: bool = False
    """Load the chosen chunks (all in CPU) in the computing step, layer by layer."""
    async_s: float = 0.0
    """Predicted TTFT of the best asynchronous load (equal to ``predicted_s`` unless layerwise)."""


def hit_cap(prompt_tokens: int, block_size: int) -> int:
    """The most a hit covers: whole blocks before the last token, which is always computed."""
    return (prompt_tokens - 1) // block_size * block_size


class CostModel:
    """Predicted load and prefill times; see the module docstring. Scheduler side, one thread."""

    def __init__(
        self,
        chunk_bytes: int,
        chunk_tokens: int,
        bandwidth: dict[Tier, float] | None = None,
        fixed_bandwidth: frozenset[Tier] = frozenset(),
        prefill: PrefillFit | None = None,
        num_layers: int = 1,
        step_tokens: int = 0,
        block_size: int = 1,
    ) -> None:
        """``bandwidth``: starting bytes/s per tier (CPU: the copy into vLLM's cache; SSD:
        the read into the CPU pool). Tiers in ``fixed_bandwidth`` keep theirs; a given
        ``prefill`` is never refitted. ``num_layers``: a layerwise load exposes one layer's copy;
        ``step_tokens``: the most tokens one engine step computes (0: unknown, no limit);
        ``block_size``: a hit ends at a whole block before the prompt's last token."""
        self.chunk_bytes = chunk_bytes
        self.block_size = max(1, block_size)
        self.step_tokens = step_tokens
        self.num_layers = max(1, num_layers)
        self.step_seconds: float | None = None  # moving average of observed step times
        self.chunk_tokens = chunk_tokens
        self.bandwidth = {Tier.CPU: 10e9, Tier.SSD: 1e9, Tier.REMOTE: 1e9, **(bandwidth or {})}
        self.layerwise_bandwidth: float | None = None  # learned from layerwise loads
        self._fixed_bw = fixed_bandwidth
        self.ssd_measured = Tier.SSD in fixed_bandwidth
        """Whether the SSD read bandwidth is known (configured, probed or seen in reads),
        not the default guess."""
        self._measured = {Tier.SSD} | set(fixed_bandwidth)  # first reads replace the guess
        self._fixed_prefill = prefill is not None
        self.prefill = prefill
        self._steps: deque[tuple[float, float, float, float]] = deque(maxlen=WINDOW)
        self._prefill_steps = 0
        self._prefill_totals = (0.0, 0.0)  # (tokens, seconds) of the steps that count as prefill
        self._since_fit = 0
        self.observed_steps = 0

    @property
    def calibrated(self) -> bool:
        return self.prefill is not None

    # ---- predictions ----
    def chunk_recompute_seconds(self, end: int = 0) -> float | None:
        """What computing one chunk's tokens costs: the fit's per-token term, plus its
        attention term for the chunk that ends at token ``end`` (0: none, the cheapest
        chunk); before a fit, the mean seconds per token of the prefill steps seen (None:
        none seen yet)."""
        ct = self.chunk_tokens
        fit = self.prefill or self._rough_fit()
        if fit is None:
            return None
        return fit.per_token * ct + fit.per_pair * ct * max(0, end - ct / 2)

    def _rough_fit(self) -> PrefillFit | None:
        """Before a fit: the mean seconds per token of the prefill steps seen (None: none
        seen yet). It prices recompute high (each step's fixed cost counts as tokens'), so
        a chunk it declines is one that even that price does not pay to load."""
        tokens, seconds = self._prefill_totals
        return PrefillFit(0.0, seconds / tokens, 0.0) if tokens > 0 else None

    def loses_to_recompute(self, tier: Tier, prompt_tokens: int) -> bool:
        """Whether loading a chunk from ``tier`` is predicted slower than recomputing even
        the costliest chunk of a prompt of ``prompt_tokens`` (its last); False before any
        prefill step was seen."""
        recompute = self.chunk_recompute_seconds(prompt_tokens)
        return recompute is not None and self.chunk_load_seconds(tier) > recompute

    def chunk_load_seconds(self, tier: Tier) -> float:
        copy = self.chunk_bytes / self.bandwidth[Tier.CPU]
        return copy if tier is Tier.CPU else copy + self.chunk_bytes / self.bandwidth[tier]

    def load_seconds(self, tiers: Sequence[Tier]) -> float:
        return sum(self.chunk_load_seconds(t) for t in tiers)

    def layerwise_seconds(self, load: float, prefill: float) -> float:
        """TTFT of a load overlapped with the prefill, layer by layer."""
        return max(load, prefill) + load / self.num_layers

    def async_seconds(self, load: float, prefill: float) -> float:
        """TTFT of a load before the prefill, in a later engine step."""
        fallback = self.prefill.step if self.prefill is not None else 0.0
        step = self.step_seconds if self.step_seconds is not None else fallback
        return load + prefill + step

    def choose(
        self,
        tiers: Sequence[Tier],
        prompt_tokens: int,
        gpu_hit: int,
        overlap: bool = False,
        others: int = 0,
        instep: int = 0,
    ) -> Decision:
        """How many of the resident chunks ``tiers`` (in prefix order) to load, and how.

        ``overlap``: a load of the leading CPU chunks may be layerwise (see the
        module docstring); otherwise every load is predicted load-then-compute.
        ``others``: requests running beside this one, which a layerwise load would hold up.
        ``instep``: a layerwise load may also read SSD chunks, up to this many leading
        chunks (0: only the leading CPU run; none of them remote), and weighs every such
        prefix.
        """
        n = len(tiers)
        fast = next((i for i, t in enumerate(tiers) if t is not Tier.CPU), n)
        fit = self.prefill or (self._rough_fit() if fast < n else None)
        if fit is None:
            lw = overlap and n > 0 and fast == n and others == 0
            return Decision(n, n, 0.0, 0.0, 0.0, False, layerwise=lw)
        calibrated = self.prefill is not None
        ct = self.chunk_tokens
        load = self.load_seconds(tiers[:fast])
        times: dict[int, float] = {}
        for length in range(fast, n + 1):
            if length > fast:
                load += self.chunk_load_seconds(tiers[length - 1])
            done = min(gpu_hit + length * ct, hit_cap(prompt_tokens, self.block_size))
            times[length] = load + fit.seconds(prompt_tokens - done, done)
        best = min(times, key=lambda length: (times[length], -length))
        recompute = fit.seconds(prompt_tokens - gpu_hit, gpu_hit)
        lengths = self._instep_lengths(tiers, fast, instep)
        if not overlap or not lengths or not calibrated:
            return Decision(
                best, n, times[best], times[n], recompute, calibrated, async_s=times[best]
            )
        best_async = times[best] - self.load_seconds(tiers[:best])  # the prefill part
        async_s = self.async_seconds(self.load_seconds(tiers[:best]), best_async)
        scored = [
            (self._instep_seconds(tiers[:k], prompt_tokens, gpu_hit, fit), k) for k in lengths
        ]
        (lw, in_step), length = min(scored, key=lambda x: (x[0][0], -x[1]))
        if lw + others * (in_step[1] - in_step[0]) <= async_s:
            return Decision(length, n, lw, times[n], recompute, True, True, async_s)
        return Decision(best, n, async_s, times[n], recompute, True, False, async_s)

    def _instep_lengths(self, tiers: Sequence[Tier], fast: int, instep: int) -> list[int]:
        """The lengths of in-step load to weigh: the leading CPU run, or with ``instep``
        every prefix of up to that many chunks."""
        if not instep:
            return [fast] if fast else []
        return list(range(max(fast, 1), min(instep, len(tiers)) + 1))

    def _instep_seconds(
        self, tiers: Sequence[Tier], prompt_tokens: int, gpu_hit: int, fit: PrefillFit
    ) -> tuple[float, tuple[float, float]]:
        """TTFT of loading ``tiers`` inside the step that computes the rest, and (the step's
        prefill alone, the step with the load): the disk reads and the copies run layer by
        layer beside the first step; the prompt's tokens past ``step_tokens`` compute after."""
        layer_bw, bs = self.layerwise_bandwidth or self.bandwidth[Tier.CPU], self.block_size
        ssd = sum(1 for t in tiers if t is Tier.SSD)
        load = max(
            len(tiers) * self.chunk_bytes / layer_bw,
            ssd * self.chunk_bytes / self.bandwidth[Tier.SSD],
        )
        done = min(gpu_hit + len(tiers) * self.chunk_tokens, hit_cap(prompt_tokens, bs))
        rest = prompt_tokens - done
        first = min(rest, self.step_tokens) if self.step_tokens else rest
        prefill = fit.seconds(first, done)
        step = self.layerwise_seconds(load, prefill)
        return step + fit.seconds(rest - first, done + first), (prefill, step)

    # ---- calibration ----
    def observe_load(self, tier: Tier, nbytes: int, seconds: float) -> None:
        """A finished transfer: CPU, a copy into vLLM's cache; SSD, a read into the pool."""
        if tier in self._fixed_bw or nbytes <= 0 or seconds <= 0:
            return
        old = self.bandwidth[tier]
        if tier is Tier.SSD and not self.ssd_measured:
            old, self.ssd_measured = nbytes / seconds, True  # the first read replaces the guess
        elif tier is Tier.REMOTE and tier not in self._measured:
            old = nbytes / seconds
            self._measured.add(tier)
        self.bandwidth[tier] = (1 - EWMA) * old + EWMA * (nbytes / seconds)

    def start_ssd_from_probe(self, read_bps: float) -> None:
        """The disk's read speed as measured at start-up (unless ``ssd_read_gbps`` fixes it)."""
        if Tier.SSD in self._fixed_bw or read_bps <= 0:
            return
        self.bandwidth[Tier.SSD] = read_bps
        self.ssd_measured = True

    def start_remote_from_probe(self, fetch_bps: float) -> None:
        """The remote store's fetch speed as measured at start-up (unless
        ``remote_read_gbps`` fixes it)."""
        if Tier.REMOTE in self._fixed_bw or fetch_bps <= 0:
            return
        self.bandwidth[Tier.REMOTE] = fetch_bps
        self._measured.add(Tier.REMOTE)

    def ssd_chunk_seconds(self) -> float | None:
        """Loading one chunk from SSD (read, then the copy into vLLM's cache); None while the
        disk's read speed is only the default guess."""
        return self.chunk_load_seconds(Tier.SSD) if self.ssd_measured else None

    def start_from_probe(self, load_bps: float, layerwise_bps: float) -> None:
        """Both CPU load paths as measured at start-up (unless ``cpu_load_gbps`` fixes them)."""
        if Tier.CPU in self._fixed_bw or load_bps <= 0 or layerwise_bps <= 0:
            return
        self.bandwidth[Tier.CPU] = load_bps
        self.layerwise_bandwidth = layerwise_bps

    def observe_layerwise(self, nbytes: int, seconds: float) -> None:
        """A finished layerwise load, from issue to its last layer (overlapping the prefill)."""
        if Tier.CPU in self._fixed_bw or nbytes <= 0 or seconds <= 0:
            return
        old = self.layerwise_bandwidth
        rate = nbytes / seconds
        self.layerwise_bandwidth = rate if old is None else (1 - EWMA) * old + EWMA * rate

    def observe_step(self, tokens: int, pairs: float, seconds: float) -> None:
        """One engine step: ``tokens`` computed, ``pairs`` query-key pairs, ``seconds`` wall."""
        if tokens <= 0 or seconds <= 0:
            return
        old = self.step_seconds
        self.step_seconds = seconds if old is None else (1 - EWMA) * old + EWMA * seconds
        if self._fixed_prefill:
            return
        self.observed_steps += 1
        self._steps.append((1.0, float(tokens), float(pairs), seconds))
        if tokens >= MIN_TOKENS:
            self._prefill_steps += 1
            t, sec = self._prefill_totals
            self._prefill_totals = (t + tokens, sec + seconds)
        self._since_fit += 1
        if self._prefill_steps >= MIN_STEPS and (
            self.prefill is None or self._since_fit >= REFIT_EVERY
        ):
            self._fit()

    def _fit(self) -> None:
        self._since_fit = 0
        data = np.array(self._steps)
        x, y = data[:, :3], data[:, 3]
        active = [0, 1, 2]
        coef = np.zeros(3)
        while active:  # least squares, dropping terms that come out negative
            sol, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
            if (sol >= 0).all():
                coef[active] = sol
                break
            active.pop(int(np.argmin(sol)))
        if coef[1] <= 0 and coef[2] <= 0:
            return  # no signal yet: keep the previous fit (or none)
        self.prefill = PrefillFit(float(coef[0]), float(coef[1]), float(coef[2]))


def make_cost_model(
    config: MiniFlexConfig,
    chunk_bytes: int,
    chunk_tokens: int,
    num_layers: int = 1,
    step_tokens: int = 0,
    block_size: int = 1,
) -> CostModel:
    """The model with the overrides of ``config`` (``cpu_load_gbps``, ``ssd_read_gbps``,
    ``remote_read_gbps``, ``prefill_tokens_per_s``) fixed and everything else learned."""
    bandwidth, fixed = {}, set()
    for tier, gbps in (
        (Tier.CPU, config.cpu_load_gbps),
        (Tier.SSD, config.ssd_read_gbps),
        (Tier.REMOTE, config.remote_read_gbps),
    ):
        if gbps is not None:
            bandwidth[tier] = gbps * 1e9
            fixed.add(tier)
    tps = config.prefill_tokens_per_s
    prefill = PrefillFit(0.0, 1.0 / tps, 0.0) if tps is not None else None
    return CostModel(
        chunk_bytes,
        chunk_tokens,
        bandwidth,
        frozenset(fixed),
        prefill,
        num_layers,
        step_tokens,
        block_size,
    )
