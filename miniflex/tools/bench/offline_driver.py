"""Drive vLLM's offline ``LLM`` in this process: one engine configuration at a time.

TTFT of a request sent alone is the wall time of a ``max_tokens=1`` request
(prefill plus one token). The open loop adds requests to the engine as their
arrival times pass and steps it in between, so requests overlap as they would
in a server; the first output carrying a token gives the request's TTFT.

This is the only module of the benchmarks that imports vLLM (lazily).
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from miniflex.errors import MiniFlexError
from miniflex.tools.bench.configs import Connector, EngineConfig, TierSizes
from miniflex.tools.bench.driver import Arrival, Driver
from miniflex.tools.bench.samples import Sample, load_seconds, resident_tokens, tier_tokens
from miniflex.tools.offline_llm import evict_gpu_prefix_cache, shutdown_llm

__all__ = ["EngineSettings", "OfflineDriver", "on_cuda"]

EXTERNAL_HITS = "vllm:external_prefix_cache_hits"
TIME_TAKEN = "vllm:miniflex_time_taken_seconds_total"
HELD = ("vllm:miniflex_blocks_held_requests_total", "vllm:miniflex_blocks_held_seconds_total")


@dataclass(frozen=True)
class EngineSettings:
    """vLLM engine arguments shared by every configuration of a run."""

    model: str
    block_size: int
    gpu_blocks: int  # vLLM's KV capacity in blocks: num_gpu_blocks_override on CUDA
    max_model_len: int
    kv_bytes_per_token: int  # the CPU backend sizes its cache in bytes
    load_format: str = "auto"
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    eager: bool = False  # enforce_eager; False: torch.compile and CUDA graphs, vLLM's default
    tensor_parallel_size: int = 1

    @property
    def capacity_tokens(self) -> int:
        return self.gpu_blocks * self.block_size

    def llm_args(self, cuda: bool) -> dict[str, Any]:
        args: dict[str, Any] = {
            "skip_tokenizer_init": True,
            "dtype": "bfloat16",
            "enforce_eager": self.eager,
            "seed": 0,
            "enable_prefix_caching": True,
            # Stats on: the native connector's hits come from vLLM's counters, and the engine
            # core then reports every step, so the open loop can add arrivals between steps
            # even while no request produces a token (all waiting for KV loads, say).
            "disable_log_stats": False,
            "load_format": self.load_format,
            "block_size": self.block_size,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "tensor_parallel_size": self.tensor_parallel_size,
        }
        if cuda:
            args["num_gpu_blocks_override"] = self.gpu_blocks
            args["gpu_memory_utilization"] = self.gpu_memory_utilization
        else:
            args["kv_cache_memory_bytes"] = self.capacity_tokens * self.kv_bytes_per_token
        return args


def on_cuda() -> bool:
    """True when vLLM runs on a CUDA GPU here (False on the CPU backend)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cuda())


class OfflineDriver(Driver):
    """An ``LLM`` for one configuration; :meth:`close` shuts its engine down."""

    def __init__(self, config: EngineConfig, settings: EngineSettings, tiers: TierSizes) -> None:
        from vllm import LLM
        from vllm.config import KVTransferConfig

        kv = config.kv_transfer(tiers)
        self.name = config.name
        self.connector = config.connector
        self.capacity_tokens = settings.capacity_tokens
        with config.environment():  # what a connector reads from the environment only
            self.llm = LLM(
                model=settings.model,
                kv_transfer_config=None if kv is None else KVTransferConfig(**kv),
                **settings.llm_args(on_cuda()),
            )
        self._ids = itertools.count()
        self._scratch = tiers.ssd_dir

    # ---- requests ----
    def _params(self, max_tokens: int) -> Any:
        from vllm import SamplingParams

        return SamplingParams(
            max_tokens=max_tokens, temperature=0, ignore_eos=True, detokenize=False
        )

    def _sample(self, out: Any, label: str, ttft_ms: float, e2e_ms: float, at: float) -> Sample:
        comp = out.outputs[0]
        params = (out.kv_transfer_params or {}).get("miniflex")
        external = None if params is None else int(params["hit_tokens"])
        if self.connector is Connector.NONE:
            external = 0
        return Sample(
            label=label,
            prompt_tokens=len(out.prompt_token_ids or ()),
            ttft_ms=round(ttft_ms, 2),
            e2e_ms=round(e2e_ms, 2),
            output_tokens=len(comp.token_ids),
            arrival_s=round(at, 4),
            cached_tokens=int(out.num_cached_tokens or 0),
            external_tokens=external,
            tiers=tier_tokens(params),
            first_token=comp.token_ids[0] if comp.token_ids else None,
            load=(params or {}).get("load"),
            resident=resident_tokens(params),
            load_s=load_seconds(params),
        )

    def prefill(self, tokens: Sequence[int], label: str) -> Sample:
        before = self._external_counter()
        t0 = time.perf_counter()
        out = self.llm.generate(
            [{"prompt_token_ids": list(tokens)}], self._params(1), use_tqdm=False
        )[0]
        ms = 1e3 * (time.perf_counter() - t0)
        sample = self._sample(out, label, ms, ms, 0.0)
        if self.connector.hits_from_vllm_counter and before is not None:
            after = self._external_counter()
            if after is not None:
                sample = _with_external(sample, int(after - before))
        return sample

    def open_loop(self, arrivals: Sequence[Arrival]) -> tuple[list[Sample], float]:
        engine = self.llm.llm_engine
        todo = deque(sorted(arrivals, key=lambda a: a.at_s))
        meta: dict[str, tuple[Arrival, float | None]] = {}
        samples: list[Sample] = []
        t0 = time.perf_counter()
        while todo or engine.has_unfinished_requests():
            now = time.perf_counter() - t0
            while todo and todo[0].at_s <= now:
                a = todo.popleft()
                rid = f"bench-{next(self._ids)}"
                meta[rid] = (a, None)
                engine.add_request(
                    rid, {"prompt_token_ids": list(a.tokens)}, self._params(a.max_tokens)
                )
            if not engine.has_unfinished_requests():
                time.sleep(max(0.0, min(todo[0].at_s - now, 0.05)) if todo else 0.0)
                continue
            for out in engine.step():
                t = time.perf_counter() - t0
                a, first = meta[out.request_id]
                if first is None and out.outputs and out.outputs[0].token_ids:
                    first = t
                    meta[out.request_id] = (a, first)
                if out.finished:
                    ttft = 1e3 * ((first if first is not None else t) - a.at_s)
                    samples.append(self._sample(out, a.label, ttft, 1e3 * (t - a.at_s), a.at_s))
        if not samples:
            return samples, 0.0
        start = min(s.arrival_s for s in samples)
        end = max(s.arrival_s + s.e2e_ms / 1e3 for s in samples)
        if self.connector.hits_from_vllm_counter:
            samples = [_with_external(s, None) for s in samples]  # per request: not known
        return samples, end - start

    # ---- cache control ----
    def evict_gpu(self) -> None:
        evict_gpu_prefix_cache(self.llm)

    def reset(self, timeout_s: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout_s
        # Refused while a connector still holds blocks of finished requests (saves in flight).
        while not self.llm.reset_prefix_cache(reset_connector=True):
            if time.monotonic() > deadline:
                raise MiniFlexError(f"vLLM's caches could not be reset within {timeout_s} s")
            time.sleep(0.02)
        return True

    def close(self) -> None:
        """Shut the engine down, then empty the run's SSD directory: the next configuration
        starts with nothing on disk (and vLLM's fs tier, which never evicts, frees its files)."""
        shutdown_llm(self.llm)
        del self.llm
        if self._scratch and os.path.isdir(self._scratch):
            for entry in os.scandir(self._scratch):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)

    def time_taken(self) -> dict[str, float] | None:
        """From the Prometheus registry itself: vLLM's ``get_metrics`` rounds counters to
        whole numbers. The counters lag by at most one of MiniFlex's stats reports."""
        if self.connector is not Connector.MINIFLEX:
            return None
        out: dict[str, float] = {}
        for s in _registry_samples({TIME_TAKEN}):
            where = s.labels.get("where", "")
            out[where] = out.get(where, 0.0) + s.value
        return out

    def blocks_held(self) -> tuple[float, float] | None:
        """Finished requests whose blocks vLLM kept for MiniFlex, and their seconds held,
        so far (``connector/held_blocks.py``; None: not MiniFlex). Lags as ``time_taken``."""
        if self.connector is not Connector.MINIFLEX:
            return None
        out = dict.fromkeys(HELD, 0.0)
        for s in _registry_samples(set(HELD)):
            out[s.name] += s.value
        return out[HELD[0]], out[HELD[1]]

    def _external_counter(self) -> float | None:
        """vLLM's counter of tokens loaded by the KV connector (None: not exported)."""
        if not self.connector.hits_from_vllm_counter:
            return None
        values = [
            m.value
            for m in self.llm.get_metrics()
            if m.name == EXTERNAL_HITS and hasattr(m, "value")
        ]
        return float(sum(values)) if values else None


def _registry_samples(names: set[str]) -> Iterator[Any]:
    """The samples of this process's Prometheus registry named in ``names``."""
    import prometheus_client

    for family in prometheus_client.REGISTRY.collect():
        yield from (s for s in family.samples if s.name in names)


def _with_external(s: Sample, external: int | None) -> Sample:
    return replace(s, external_tokens=external)
