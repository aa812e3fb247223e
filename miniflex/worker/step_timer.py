"""Worker-side timing of vLLM's forward passes, for the cost model's prefill fit.

``start`` is called when a step's forward begins (``start_load_kv``) and
``stop`` when it has been issued (``wait_for_save``). On CUDA the forward runs
asynchronously, so the two ends are CUDA events on vLLM's stream and a step is
reported once its end event has completed; on the CPU backend wall time is
exact. Nothing here ever waits.
"""

from __future__ import annotations

import time

import torch

__all__ = ["StepTimer"]


class StepTimer:
    """Times steps by id; :meth:`take` returns ``(step, seconds)`` of the finished ones."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._device = device
        self._open: tuple[int, object] | None = None
        self._pending: list[tuple[int, object, object]] = []

    def start(self, step: int) -> None:
        self._open = (step, self._mark())

    def stop(self, step: int) -> None:
        if self._open is None or self._open[0] != step:
            return  # this step's start was not seen (a hook vLLM skipped)
        self._pending.append((step, self._open[1], self._mark()))
        self._open = None

    def take(self) -> list[tuple[int, float]]:
        done, still = [], []
        for step, t0, t1 in self._pending:
            if not self._cuda:
                done.append((step, float(t1) - float(t0)))  # type: ignore[arg-type]
            elif t1.query():  # type: ignore[attr-defined]
                done.append((step, t0.elapsed_time(t1) / 1e3))  # type: ignore[attr-defined]
            else:
                still.append((step, t0, t1))
        self._pending = still[-64:]  # never grows without bound
        return done

    def _mark(self) -> object:
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self._device))
        return event
