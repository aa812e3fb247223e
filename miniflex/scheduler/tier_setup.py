"""The scheduler's tier stack, wired to the cost model that sizes and steers its write-back,
and to the remote tier's write-back (``remote_write=back``)."""

from __future__ import annotations

from miniflex.config import MiniFlexConfig
from miniflex.cost import CostModel
from miniflex.keys import Namespace
from miniflex.scheduler.advisor import HitAdvisor
from miniflex.tiers import TierStack
from miniflex.types import Tier

__all__ = ["EngineCosts", "build_tiers"]


def build_tiers(
    config: MiniFlexConfig,
    ns: Namespace,
    cost: CostModel,
    advisor: HitAdvisor,
    num_slots: int,
    ssd_slots: int,
    step_tokens: int,
    max_model_len: int,
    keep_evictions: bool = False,
    stream_slots: int = 0,
) -> TierStack:
    """The CPU tier of ``num_slots`` over an SSD tier of ``ssd_slots`` (0: none).
    ``step_tokens``: vLLM's ``max_num_batched_tokens`` (0: unknown); ``max_model_len``:
    the longest prompt (its last chunk costs most to recompute); ``keep_evictions``: list
    every chunk the CPU tier evicts in the stack's demotion batches (the remote tier's
    write-back, :mod:`miniflex.scheduler.remote_puts`); ``stream_slots``: the workers' staging slots
    for SSD reads past the CPU tier (0: none)."""
    step_chunks = -(-step_tokens // ns.chunk_tokens)
    with_ssd = ssd_slots > 0 and cost.chunk_bytes > 0
    return TierStack(
        num_slots,
        config.cpu_eviction,
        ssd_slots,
        config.ssd_eviction,
        write_through=config.ssd_write == "through",
        max_writeback=_writeback_chunks(config, num_slots, cost.chunk_bytes, step_chunks),
        costs=EngineCosts(cost, advisor, max_model_len),
        keep_evictions=keep_evictions,
        # until writes are seen: as fast as reads
        write_seconds=cost.chunk_bytes / cost.bandwidth[Tier.SSD] if with_ssd else None,
        stream_slots=stream_slots,
    )


class EngineCosts:
    """The cost model and the advisor as write-back sees them
    (:class:`~miniflex.tiers.writeback.WriteBackCosts`)."""

    def __init__(self, cost: CostModel, advisor: HitAdvisor, max_model_len: int) -> None:
        """``max_model_len``: the longest prompt, whose last chunk costs most to recompute."""
        self._cost = cost
        self._advisor = advisor
        self._max_model_len = max_model_len

    def write_wait_budget(self) -> float:
        return self._advisor.write_wait_budget()

    def chunk_recompute_seconds(self) -> float | None:
        return self._cost.chunk_recompute_seconds()

    def costliest_recompute_seconds(self) -> float | None:
        """None until the prefill model is fitted: before that its rough figure prices
        recompute high (a step's fixed cost counted as its tokens'), which makes any disk
        look fast: it can put a chunk's read well below the fitted ratio, and admission then
        writes chunks until the fit turns it off (docs/benchmarks.md, "burst")."""
        if not self._cost.calibrated:
            return None
        return self._cost.chunk_recompute_seconds(self._max_model_len)

    def rough_recompute_seconds(self) -> float | None:
        """Before the fit: the mean seconds per token of the prefill steps seen, for one
        chunk (None: fitted, or no prefill step seen). It only holds SSD writes back."""
        return None if self._cost.calibrated else self._cost.chunk_recompute_seconds()

    def ssd_chunk_seconds(self) -> float | None:
        return self._cost.ssd_chunk_seconds()


def _writeback_chunks(
    config: MiniFlexConfig, num_slots: int, chunk_bytes: int, step_chunks: int
) -> int:
    """``ssd_write_backlog`` in chunks. ``auto``: one engine step's worth of chunks, so that
    a disk that writes a step's KV within a step drops nothing; within 1/8 to 1/2 of the CPU
    tier (a quarter when the step size is unknown). Always leaves a slot to store into."""
    if config.ssd_write_backlog is not None and chunk_bytes > 0:
        n = config.ssd_write_backlog // chunk_bytes
    elif step_chunks > 0:
        n = min(max(step_chunks, num_slots // 8), num_slots // 2)
    else:
        n = num_slots // 4
    return max(1, min(n, num_slots - 1))
