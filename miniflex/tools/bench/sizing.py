"""Tier sizes and ``max_model_len`` derived from the workloads, unless given explicitly.

The MiniFlex CPU tier (and the native connector's, which gets the same size)
must hold the largest working set of the run, so that the comparison is
about how a tier serves hits, not about its capacity. ``miniflex-ssd`` gets a
CPU tier of a quarter of that working set, so that most of its hits have to
come from the SSD tier.
"""

from __future__ import annotations

from collections.abc import Sequence

from miniflex.config import MiniFlexConfig
from miniflex.errors import ConfigError
from miniflex.tools.bench.base import WARMUP_TOKENS, Workload
from miniflex.tools.bench.configs import TierSizes

__all__ = ["auto_tiers", "max_model_len"]

MiB = 1 << 20
MIN_BYTES = 64 * MiB


def _round_up(n: int, unit: int = 64 * MiB) -> int:
    return -(-n // unit) * unit


SAME_AS_CPU = "cpu"
"""``--ssd-cpu-bytes cpu``: miniflex-ssd's CPU tier is as large as the CPU tier of the
other configurations, so that CPU+SSD is held against the CPU tier alone byte for byte."""


def auto_tiers(
    workloads: Sequence[Workload],
    capacity_tokens: int,
    kv_bytes_per_token: int,
    block_size: int,
    cpu_bytes: int | None,
    ssd_cpu_bytes: int | str | None,
    ssd_bytes: int | None,
    ssd_dir: str | None,
    blocks_per_chunk: int | None,
) -> TierSizes:
    """Sizes for this run; a ``None`` argument is derived from the working set, and
    ``ssd_cpu_bytes`` :data:`SAME_AS_CPU` is the CPU tier's size."""
    ws = max((w.working_set_tokens(capacity_tokens) for w in workloads), default=0)
    ws_bytes = ws * kv_bytes_per_token
    capacity_bytes = capacity_tokens * kv_bytes_per_token
    chunk_blocks = MiniFlexConfig.from_dict(
        {} if blocks_per_chunk is None else {"blocks_per_chunk": blocks_per_chunk}
    ).chunk_blocks(block_size)
    chunk_bytes = chunk_blocks * block_size * kv_bytes_per_token
    cpu = cpu_bytes or max(MIN_BYTES, _round_up(ws_bytes * 5 // 4 + capacity_bytes))
    if ssd_cpu_bytes == SAME_AS_CPU:
        ssd_cpu_bytes = cpu
    assert not isinstance(ssd_cpu_bytes, str), "a size, SAME_AS_CPU or None"
    return TierSizes(
        cpu_bytes=cpu,
        ssd_cpu_bytes=ssd_cpu_bytes or max(8 * chunk_bytes, _round_up(ws_bytes // 4, MiB)),
        ssd_bytes=ssd_bytes or max(MIN_BYTES, _round_up(ws_bytes * 3 // 2 + capacity_bytes)),
        ssd_dir=ssd_dir,
        chunk_tokens=chunk_blocks * block_size,
        blocks_per_chunk=blocks_per_chunk,
    )


def max_model_len(
    workloads: Sequence[Workload],
    block_size: int,
    gpu_blocks: int,
    model_max: int | None,
    given: int | None,
) -> int:
    """The longest prompt (a workload's, or the warm-up prompt each sends first) plus room
    for a few output tokens, in whole blocks.

    vLLM refuses to start when one request of ``max_model_len`` tokens would
    not fit its KV cache (less one block), so that is checked here first.
    """
    need = max(WARMUP_TOKENS, *(w.max_prompt_tokens() for w in workloads)) + 64
    n = given or -(-need // block_size) * block_size
    if n < need:
        raise ConfigError(
            "--max-model-len", n, f"at least {need} for the longest prompt of the run"
        )
    if model_max and n > model_max:
        raise ConfigError(
            "--max-model-len", n, f"at most the model's max_position_embeddings ({model_max})"
        )
    if n > (gpu_blocks - 1) * block_size:
        raise ConfigError(
            "--gpu-blocks",
            gpu_blocks,
            f"at least {-(-n // block_size) + 1} blocks: vLLM needs room for one request of "
            f"max_model_len={n} tokens",
        )
    return n
