"""The per-request tier trace: one JSON line per finished request (``trace_file``).

Each line says where every chunk of the request's prompt came from, so that an
operator can see which tier served a slow request, and whether the cost model's
prediction held::

    {"request": "cmpl-42-0", "prompt_tokens": 3000, "chunk_tokens": 256,
     "chunks": [{"key": "9f3c...", "from": "gpu"}, {"key": "1a07...", "from": "ssd"},
                {"key": "77e0...", "from": "failed"}, ...],
     "tokens": {"gpu": 512, "cpu": 0, "ssd": 1024, "remote": 0, "computed": 1464},
     "resident_tokens": {"cpu": 0, "ssd": 2560}, "load": "async",
     "decision": {"load_chunks": 10, "resident_chunks": 10, "predicted_s": 0.21,
                  "load_all_s": 0.21, "recompute_s": 0.48, "layerwise": false},
     "ttft_measured_s": 0.23, "stored_tokens": 2816, "time": 1733400000.0,
     "load_seconds": {"queued": 0.0, "wall": 0.19, "wait": 0.0, "ssd": 0.15,
                      "remote": 0.0, "copy": 0.03}}

A chunk's ``from`` is ``gpu`` (vLLM's own prefix cache), ``cpu``, ``ssd`` or
``remote`` (MiniFlex loaded it), ``failed`` (its read failed its checksum or
I/O: vLLM recomputed it and everything after it) or ``computed``. ``tokens``
counts the prompt's tokens by the same names, ``gpu`` and the loaded ones
block by block. ``key`` is the chunk's MiniFlex key (as an SSD journal or the
remote store names it). ``decision`` and ``ttft_measured_s`` are present when
the calibrated cost model decided the load. ``load_seconds`` (an asynchronous
load's): ``queued`` from the request's first lookup to vLLM allocating its blocks (its
wait for KV space), and on its slowest rank ``wall`` from the plan reaching the worker
to its report, ``wait`` the part of it before a lane started the load (its slots' put
copies and write-backs, its lane busy), and the time its SSD reads, remote fetches and
GPU copies took (lanes may overlap, so the parts may add up to more than ``wall``). The
file is opened once, appended to line by line (a line is whole once written, even if the
engine is killed), and never truncated.
"""

from __future__ import annotations

import json
import time
from typing import IO, Any

from miniflex.errors import ConfigError
from miniflex.keys import Namespace
from miniflex.scheduler.requests import ReqState

__all__ = ["RequestTrace", "trace_record"]


def trace_record(st: ReqState, ns: Namespace, gpu_tokens: int) -> dict[str, Any]:
    """The trace line of a finished request; ``gpu_tokens``: vLLM's own hit when MiniFlex
    was asked (tokens before the first MiniFlex load)."""
    ct, bs = ns.chunk_tokens, ns.block_size
    prompt = st.prompt_end if st.prompt_end is not None else st.num_prompt_tokens
    blocks = prompt // bs
    source = ["gpu" if b * bs < gpu_tokens else "computed" for b in range(blocks)]
    for first, tiers in st.account.loaded_spans:
        for j, tier in enumerate(tiers):
            if first + j < blocks:
                source[first + j] = tier.name.lower()
    bpc = ns.blocks_per_chunk
    chunks = []
    for i, key in enumerate(st.keys[: prompt // ct]):
        where = "failed" if i in st.failed_chunks else source[(i + 1) * bpc - 1]
        chunks.append({"key": f"{key:032x}", "from": where})
    tokens = {name: 0 for name in ("gpu", "cpu", "ssd", "remote", "computed")}
    for name in source:
        tokens[name] += bs
    tokens["computed"] += prompt - blocks * bs
    d = st.hit.decision
    out: dict[str, Any] = {
        "request": st.req_id,
        "prompt_tokens": prompt,
        "chunk_tokens": ct,
        "chunks": chunks,
        "tokens": tokens,
        "resident_tokens": dict(st.hit.resident_by_tier),
        "load": st.account.loaded_as.value if st.account.loaded_as is not None else None,
        "stored_tokens": st.account.stored_tokens,
    }
    if d is not None and d.calibrated:
        out["decision"] = {
            "load_chunks": d.load_chunks,
            "resident_chunks": d.resident_chunks,
            "predicted_s": d.predicted_s,
            "load_all_s": d.load_all_s,
            "recompute_s": d.recompute_s,
            "layerwise": d.layerwise,
        }
        out["ttft_measured_s"] = st.account.ttft_measured_s
    if st.account.load_seconds:  # the last asynchronous load's wall time and its parts
        out["load_seconds"] = dict(st.account.load_seconds)
    return out


class RequestTrace:
    """Appends :func:`trace_record` lines to ``path``; inert when ``path`` is None."""

    def __init__(self, path: str | None, ns: Namespace) -> None:
        self.ns = ns
        self._file: IO[str] | None = None
        if path is not None:
            try:
                self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
            except OSError as exc:
                raise ConfigError("trace_file", path, f"a file to append to ({exc})") from None

    @staticmethod
    def allocated(st: ReqState) -> None:
        """The request was admitted: vLLM's own hit is what it had when first admitted."""
        if st.account.gpu_hit_tokens is None:
            st.account.gpu_hit_tokens = st.num_computed_tokens

    def finished(self, st: ReqState) -> None:
        """Write the request's line (its hits are settled)."""
        if self._file is None:
            return
        gpu = st.account.gpu_hit_tokens
        gpu = gpu if gpu is not None else st.num_computed_tokens
        line = trace_record(st, self.ns, gpu)
        line["time"] = round(time.time(), 3)
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
