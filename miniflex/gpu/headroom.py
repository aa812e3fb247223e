"""GPU memory that MiniFlex allocates beside vLLM's KV cache, and whether it fits.

vLLM sizes its KV cache from ``gpu_memory_utilization`` (vLLM 0.34 defaults to 1.0 and
commits the cache after warm-up, before the connector's workers are given it), so what a
connector allocates on the device comes out of whatever vLLM left. MiniFlex's one large
device allocation is the staged mover's staging buffer: ``LANES`` lanes of
``staging_lane_bytes`` (whole slots, at least one each), 128 MiB at the defaults. The
other movers, and the staged mover besides its buffer, need a few MiB (index tables,
events, compiled kernels), within :data:`MARGIN`. Example::

    room = device_room(torch.device("cuda:0"))
    problem = staging_problem(staging_bytes(slot_bytes, 32 << 20, 4), room)
"""

from __future__ import annotations

import torch

__all__ = ["MARGIN", "device_room", "staging_bytes", "staging_problem"]

MARGIN = 64 << 20
"""Device memory kept free beyond the staging buffer: tables, events, kernels, CUDA's own."""


def staging_bytes(slot_bytes: int, lane_bytes: int, lanes: int) -> int:
    """The staged mover's buffer: ``lanes`` lanes of as many whole slots as fit in
    ``lane_bytes``, at least one."""
    return lanes * max(1, lane_bytes // slot_bytes) * slot_bytes


def device_room(device: torch.device) -> int:
    """Bytes torch can still allocate on ``device``: free on the device, plus what torch's
    caching allocator holds unused."""
    free, _total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free + max(0, cached))


def staging_problem(needed: int, room: int) -> str | None:
    """Why a staging buffer of ``needed`` bytes does not fit in ``room`` (a sentence that
    says how to make room), or None when it fits with :data:`MARGIN` to spare."""
    if needed + MARGIN <= room:
        return None
    mib = 1 << 20
    return (
        f"its staging buffer needs {needed // mib} MiB of GPU memory (and {MARGIN // mib} MiB "
        f"to spare) beside vLLM's KV cache, and {room // mib} MiB are free: lower vLLM's "
        "--gpu-memory-utilization (vLLM 0.34 defaults to 1.0) or --kv-cache-memory-bytes, "
        "set staging_lane_bytes smaller, or use mover=kernel, which needs no staging"
    )
