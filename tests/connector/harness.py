"""Drive vLLM's real Scheduler with MiniFlex's two halves wired together in one process.

The "model" is a stand-in that writes, for every block it computes, a page whose
bytes are a function of that block's prefix hash. So a block that MiniFlex loads
can be checked bit for bit against what the model would have computed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from vllm import SamplingParams
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from miniflex.connector import MiniFlexConnector
from miniflex.errors import TransferError
from miniflex.gpu.base import KVMover, LayerwiseLoad
from miniflex.plan import ChunkMove
from tests.connector.engine_config import (
    BLOCK,
    HEAD,
    HEADS,
    LAYERS,
    capture_graphs,
    make_kv_cache_config,
    make_vllm_config,
    write_model_config,
)

POISON = -1234.0
"""What the blocks of a layerwise load hold until their layer is waited for."""


class DeferredLoad(LayerwiseLoad):
    """A layerwise load whose layer ``l`` lands in vLLM's blocks only at ``wait_layer(l)``
    (or ``wait()``), as if its copy were still in flight until then: a forward that reads
    a layer without waiting for it reads poison, never bytes that happen to be right."""

    def __init__(self, kv: list[torch.Tensor], blocks: list[int], nbytes: int, log: list) -> None:
        self._kv, self._blocks, self._nbytes, self._log = kv, blocks, nbytes, log
        self._loaded = [t[blocks].clone() for t in kv]
        self._pending = set(range(len(kv)))

    def wait_layer(self, layer: int) -> None:
        self._log.append(("wait", layer))
        if layer in self._pending:
            self._pending.discard(layer)
            self._kv[layer][self._blocks] = self._loaded[layer]

    def wait(self) -> int:
        for layer in sorted(self._pending):
            self._kv[layer][self._blocks] = self._loaded[layer]
        self._pending.clear()
        return self._nbytes


class GatedMover(KVMover):
    """Wraps the real mover; clearing ``gate`` makes transfers wait so tests act mid-flight.

    Its ``load_layerwise`` defers each layer's bytes until the layer is waited for
    (``DeferredLoad``); ``fail_layerwise`` makes the next one raise at issue.
    """

    def __init__(self, inner: KVMover, kv: dict[str, torch.Tensor]) -> None:
        self.inner = inner
        self.kv = list(kv.values())
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()  # the torch mover's staging buffer is not shared-safe
        self.fail_layerwise = False
        self.log: list[tuple[str, int]] = []  # ("wait", layer) and the harness's ("read", layer)

    def store(self, chunks: Sequence[ChunkMove], after: object = None) -> int:
        self.gate.wait()
        with self.lock:
            return self.inner.store(chunks, after)

    def load(self, chunks: Sequence[ChunkMove], after: object = None) -> int:
        self.gate.wait()
        with self.lock:
            return self.inner.load(chunks, after)

    def load_layerwise(self, chunks: Sequence[ChunkMove], after: object = None) -> LayerwiseLoad:
        if self.fail_layerwise:
            self.fail_layerwise = False
            raise TransferError("injected failure at issue")
        blocks = [b for c in chunks for b in c.block_ids]
        nbytes = self.load(chunks, after)
        deferred = DeferredLoad(self.kv, blocks, nbytes, self.log)
        for t in self.kv:
            t[blocks] = POISON  # not landed yet (and never what a block held before)
        return deferred

    def fence(self) -> object:
        return self.inner.fence()


@dataclass
class Harness:
    sched: Scheduler
    worker: MiniFlexConnector
    kv: dict[str, torch.Tensor]
    mover: GatedMover
    requests: dict[str, Request]
    kv_stats: list[dict] = field(default_factory=list)
    scheduler_stats: list = field(default_factory=list)
    """Every ``SchedulerStats`` vLLM handed its stats loggers, in order."""
    params: dict[str, dict] = field(default_factory=dict)  # finished request -> kv_transfer_params
    cached_tokens: dict[str, int] = field(default_factory=dict)
    """Request -> the prompt tokens vLLM reports as not computed (its ``num_cached_tokens``)."""
    layers_read: dict[tuple[str, int, int], torch.Tensor] = field(default_factory=dict)
    """(request, block index, layer) -> the page the last step's forward read."""
    graphs: Any = None
    """vLLM's own CudagraphDispatcher when the engine replays CUDA graphs (None: eager)."""
    modes: list[str] = field(default_factory=list)
    """The CUDA graph mode each step's forward ran in (``FULL`` skips the per-layer hooks)."""
    load_errors: int = 0
    """Blocks the worker reported as load errors (vLLM recomputes them), over every step."""

    @property
    def manager_side(self) -> MiniFlexConnector:
        conn = self.sched.connector
        assert isinstance(conn, MiniFlexConnector)
        return conn

    def add(self, req_id: str, tokens: list[int], max_tokens: int = 1) -> Request:
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        sp.update_from_generation_config({}, 2)
        req = Request(
            req_id, tokens, sp, None, block_hasher=get_request_block_hasher(BLOCK, sha256)
        )
        self.requests[req_id] = req
        self.sched.add_request(req)
        return req

    def step(
        self,
        wait_transfers: bool = True,
        on_schedule: Callable[[SchedulerOutput], None] | None = None,
    ) -> SchedulerOutput:
        so = self.sched.schedule()
        if on_schedule is not None:
            on_schedule(so)
        meta = so.kv_connector_metadata
        self.worker.handle_preemptions(meta)
        if on_schedule is not None:
            on_schedule(so)
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(None)
        self._compute(so)
        self.worker.wait_for_save()
        if wait_transfers:
            self.worker.handler.drain()
        sending, recving = self.worker.get_finished(so.finished_req_ids)
        invalid = self.worker.get_block_ids_with_load_errors()
        self.load_errors += len(invalid)
        out = KVConnectorOutput(
            finished_sending=sending,
            finished_recving=recving,
            invalid_block_ids=invalid,
            kv_connector_worker_meta=self.worker.build_connector_worker_meta(),
        )
        self.worker.clear_connector_metadata()
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for r in ids:
            req = self.requests[r]
            done = req.num_computed_tokens >= req.num_tokens
            sampled.append([7] if done else [])
        outputs = self.sched.update_from_output(
            so,
            ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=sampled,
                kv_connector_output=out,
            ),
        )
        for eco in outputs.values():  # what vLLM hands its stats loggers
            if eco.scheduler_stats is not None:
                self.scheduler_stats.append(eco.scheduler_stats)
            stats = eco.scheduler_stats.kv_connector_stats if eco.scheduler_stats else None
            if stats:
                self.kv_stats.append(stats)
            for o in eco.outputs:  # what the finished request returns to its caller
                if o.prefill_stats is not None:
                    self.cached_tokens[o.request_id] = o.prefill_stats.num_cached_tokens
                if o.kv_transfer_params:
                    self.params[o.request_id] = o.kv_transfer_params
        return so

    def hits_by_source(self) -> dict[str, int]:
        """Connector hit tokens by source as vLLM 0.32+ counts them for
        ``vllm:prompt_tokens_cached_by_source`` ("host", "disk", ...), summed over steps."""
        out: dict[str, int] = {}
        for s in self.scheduler_stats:
            pcs = s.connector_prefix_cache_stats
            for source, n in getattr(pcs, "hits_by_source", {}).items():
                out[source.value] = out.get(source.value, 0) + n
        return out

    def cached_in_miniflex_only(self, req_id: str, tokens: list[int]) -> int:
        """Serve a prompt, then drop vLLM's own copy; returns the free block count after."""
        self.add(req_id, tokens)
        self.run()
        assert self.sched.reset_prefix_cache()
        return self.free_blocks()

    def run(self, max_steps: int = 200) -> None:
        """Step until every request is finished and freed."""
        for _ in range(max_steps):
            if not self.sched.requests and not self.manager_side.has_pending_push_work():
                return
            self.step()
        raise AssertionError(f"not idle after {max_steps} steps: {list(self.sched.requests)}")

    def page(self, req: Request, block_index: int, layer: int) -> torch.Tensor:
        """What the stand-in model writes for a block: a function of its prefix hash."""
        seed = int.from_bytes(bytes(req.block_hashes[block_index])[:6], "little") + layer
        gen = torch.Generator().manual_seed(seed)
        return torch.randn(HEADS, BLOCK, 2 * HEAD, generator=gen).half()

    def _graph_mode(self, so: SchedulerOutput) -> str:
        """How vLLM's model runner would run this step: its own uniform-decode test and
        CUDA graph dispatcher (``NONE`` without graphs)."""
        counts = list(so.num_scheduled_tokens.values())
        if self.graphs is None or not counts:
            return "NONE"
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        q = self.graphs.uniform_decode_query_len
        uniform = GPUModelRunner._is_uniform_decode(max(counts), q, sum(counts), len(counts))
        mode, _ = self.graphs.dispatch(sum(counts), uniform_decode=uniform)
        return str(mode.name)

    def _compute(self, so: SchedulerOutput) -> None:
        """Layer by layer, as vLLM's attention layers run (each waits for its KV first,
        unless the step replays a full CUDA graph, which runs no hook)."""
        self.layers_read = {}
        mode = self._graph_mode(so)
        self.modes.append(mode)
        for layer, (name, t) in enumerate(self.kv.items()):
            if so.num_scheduled_tokens and mode != "FULL":
                self.worker.wait_for_layer_load(name)
                self.mover.log.append(("read", layer))
            for r, n in so.num_scheduled_tokens.items():
                req = self.requests[r]
                (block_ids,) = self.sched.kv_cache_manager.get_block_ids(r)
                # what attention reads: the request's earlier blocks (loaded or computed)
                computed = req.num_computed_tokens - n
                for b in range(computed // BLOCK):
                    self.layers_read[(r, b, layer)] = t[block_ids[b]].clone()
                # schedule() has already advanced num_computed_tokens past this step's tokens
                start, end = computed, req.num_computed_tokens
                for b in range(start // BLOCK, min(end // BLOCK, len(req.block_hashes))):
                    t[block_ids[b]] = self.page(req, b, layer)

    def read_matches(self, req: Request, num_blocks: int) -> bool:
        """The last step's forward read the right bytes of the first ``num_blocks`` blocks."""
        r = req.request_id
        return all(
            torch.equal(self.layers_read[(r, b, layer)], self.page(req, b, layer))
            for b in range(num_blocks)
            for layer in range(LAYERS)
        )

    def loaded_blocks_match(self, req: Request, num_blocks: int) -> bool:
        (block_ids,) = self.sched.kv_cache_manager.get_block_ids(req.request_id)
        return all(
            torch.equal(t[block_ids[b]], self.page(req, b, layer))
            for b in range(num_blocks)
            for layer, t in enumerate(self.kv.values())
        )

    def free_blocks(self) -> int:
        return self.sched.kv_cache_manager.block_pool.get_num_free_blocks()

    def finished_and_freed(self, req_id: str) -> bool:
        return req_id not in self.sched.requests

    def status(self, req_id: str) -> RequestStatus:
        return self.requests[req_id].status


def make_harness(
    model_dir: Path,
    num_blocks: int = 64,
    blocks_per_chunk: int = 2,
    cpu_bytes: str = "1MiB",
    max_batched: int = 512,
    extra: dict | None = None,
    load_mode: str = "async",
    cudagraphs: str | None = None,
) -> Harness:
    """``extra``: more ``kv_connector_extra_config`` keys (e.g. the SSD tier's).

    ``load_mode`` defaults to ``async``: most flows here test requests waiting
    for their load; in-step loads have tests of their own. ``cudagraphs``: a
    ``CUDAGraphMode`` name (``FULL_AND_PIECEWISE``, vLLM's default on GPUs); each
    step is then dispatched by vLLM's own CudagraphDispatcher, and a step it
    replays as a full graph calls no ``wait_for_layer_load``."""
    write_model_config(model_dir)
    vc = make_vllm_config(
        model_dir,
        {
            "cpu_bytes": cpu_bytes,
            "blocks_per_chunk": blocks_per_chunk,
            "load_mode": load_mode,
            **(extra or {}),
        },
        num_blocks,
        max_batched,
    )
    if cudagraphs is not None:
        capture_graphs(vc, cudagraphs)
    kcc = make_kv_cache_config(num_blocks)
    init_none_hash(sha256)
    # vLLM's order: the workers register their KV caches (and open their SSD
    # stores) before the scheduler, and so its connector, is built.
    worker = MiniFlexConnector(vc, KVConnectorRole.WORKER, kcc)
    kv = {
        f"layer{i}": torch.zeros(num_blocks, HEADS, BLOCK, 2 * HEAD, dtype=torch.float16)
        for i in range(LAYERS)
    }
    worker.register_kv_caches(kv)
    sched = Scheduler(
        vllm_config=vc,
        kv_cache_config=kcc,
        structured_output_manager=StructuredOutputManager(vc),
        block_size=BLOCK,
        log_stats=True,
    )
    handler = worker.handler
    mover = GatedMover(handler._mover, kv)  # the real mover, made pausable
    handler._mover = mover
    handler._bind_step_loads(kv)
    graphs = None
    if cudagraphs is not None:
        from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

        graphs = CudagraphDispatcher(vc)
        graphs.initialize_cudagraph_keys(vc.compilation_config.cudagraph_mode, 1)
    return Harness(sched, worker, kv, mover, {}, graphs=graphs)
