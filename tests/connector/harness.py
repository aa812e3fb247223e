"""Drive vLLM's real Scheduler with MiniFlex's two halves wired together in one process.

The "model" is a stand-in that writes, for every block it computes, a page whose
bytes are a function of that block's prefix hash. So a block that MiniFlex loads
can be checked bit for bit against what the model would have computed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
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
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

import miniflex.connector
from miniflex.connector import MiniFlexConnector, compat
from tests.connector.engine_config import (
    BLOCK,
    HEAD,
    HEADS,
    LAYERS,
    capture_graphs,
    make_kv_cache_config,
    make_vllm_config,
    mla_attention,
    page_shape,
    runner_output,
    write_model_config,
)
from tests.connector.graph_oracle import graph_oracle
from tests.connector.movers import POISON, GatedMover

__all__ = ["BLOCK", "HEAD", "HEADS", "LAYERS", "POISON", "Harness", "Rank", "make_harness"]


@dataclass
class Rank:
    """One TP rank's worker: its connector, its KV tensors, its (pausable) mover."""

    rank: int
    worker: MiniFlexConnector
    kv: dict[str, torch.Tensor]
    mover: GatedMover
    layers_read: dict[tuple[str, int, int], torch.Tensor] = field(default_factory=dict)
    """(request, block index, layer) -> the page this rank's last forward read."""


@dataclass
class Harness:
    sched: Scheduler
    ranks: list[Rank]
    requests: dict[str, Request]
    kv_stats: list[dict] = field(default_factory=list)
    scheduler_stats: list = field(default_factory=list)
    """Every ``SchedulerStats`` vLLM handed its stats loggers, in order."""
    params: dict[str, dict] = field(default_factory=dict)  # finished request -> kv_transfer_params
    cached_tokens: dict[str, int] = field(default_factory=dict)
    """Request -> the prompt tokens vLLM reports as not computed (its ``num_cached_tokens``)."""
    graphs: Any = None
    """vLLM's own answer to how each step runs when the engine replays CUDA graphs
    (``graph_oracle.py``; None: eager)."""
    modes: list[str] = field(default_factory=list)
    """The CUDA graph mode each step's forward ran in (``FULL`` skips the per-layer hooks)."""
    load_errors: int = 0
    """Blocks the workers reported as load errors (vLLM recomputes them), over every step."""
    aggregator: Any = None
    """vLLM's KVOutputAggregator, which merges the ranks' outputs (TP > 1)."""
    mla: bool = False
    """The model caches MLA latent vectors (one head, the same on every rank)."""

    @property
    def worker(self) -> MiniFlexConnector:
        return self.ranks[0].worker

    @property
    def kv(self) -> dict[str, torch.Tensor]:
        return self.ranks[0].kv

    @property
    def mover(self) -> GatedMover:
        return self.ranks[0].mover

    @property
    def manager_side(self) -> MiniFlexConnector:
        conn = self.sched.connector
        assert isinstance(conn, MiniFlexConnector)
        return conn

    def add(
        self, req_id: str, tokens: list[int], max_tokens: int = 1, sched: bool = True
    ) -> Request:
        """A request, added to vLLM's scheduler unless ``sched`` is False."""
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        sp.update_from_generation_config({}, 2)
        hasher = get_request_block_hasher(BLOCK, sha256)
        req = self.requests[req_id] = Request(req_id, tokens, sp, None, block_hasher=hasher)
        if sched:
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
        for r in self.ranks:
            r.worker.handle_preemptions(so.kv_connector_metadata)
        if on_schedule is not None:
            on_schedule(so)
        mode = self._graph_mode(so)
        self.modes.append(mode)
        outs = [self._worker_step(r, so, mode, wait_transfers) for r in self.ranks]
        out = outs[0]
        if self.aggregator is not None:
            runner_outs = [runner_output([], kv=o) for o in outs]
            out = self.aggregator.aggregate(runner_outs).kv_connector_output
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for r in ids:
            req = self.requests[r]
            done = req.num_computed_tokens >= req.num_tokens
            sampled.append([7] if done else [])
        outputs = self.sched.update_from_output(so, runner_output(ids, sampled, out))
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

    def _worker_step(
        self, r: Rank, so: SchedulerOutput, mode: str, wait: bool
    ) -> KVConnectorOutput:
        """One rank's part of the step, in vLLM's hook order."""
        r.worker.bind_connector_metadata(so.kv_connector_metadata)
        r.worker.start_load_kv(None)
        self._compute(r, so, mode)
        r.worker.wait_for_save()
        if wait:
            r.worker.handler.drain()
        sending, recving = r.worker.get_finished(so.finished_req_ids)
        invalid = r.worker.get_block_ids_with_load_errors()
        self.load_errors += len(invalid)
        out = KVConnectorOutput(
            finished_sending=sending,
            finished_recving=recving,
            invalid_block_ids=invalid,
            kv_connector_worker_meta=r.worker.build_connector_worker_meta(),
        )
        r.worker.clear_connector_metadata()
        return out

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

    def serve(self, req_id: str, prompt: list[int], steps: int = 8, read: bool = False) -> int:
        """Serve ``prompt`` to the end; returns the tokens vLLM did not compute when it
        scheduled the request (what it loaded, checked byte for byte). ``read``: instead,
        check what every rank's next forward read of the whole prompt."""
        req = self.add(req_id, prompt, max_tokens=2)
        for _ in range(steps):  # a load, its completion, then scheduling with the prefix
            so = self.step()
            new = next((r for r in so.scheduled_new_reqs if r.req_id == req_id), None)
            if new is not None:
                break
        assert new is not None, f"{req_id} was never scheduled"
        if read:
            self.step()  # the next forward reads the whole prefix, loaded or recomputed
            assert self.read_matches(req, len(prompt) // BLOCK)
        else:
            assert self.loaded_blocks_match(req, new.num_computed_tokens // BLOCK)
        self.run()
        return new.num_computed_tokens

    def run(self, max_steps: int = 200) -> None:
        """Step until every request is finished and freed."""
        for _ in range(max_steps):
            if not self.sched.requests and not self.manager_side.has_pending_push_work():
                return
            self.step()
        raise AssertionError(f"not idle after {max_steps} steps: {list(self.sched.requests)}")

    def page(self, req: Request, block_index: int, layer: int, rank: int = 0) -> torch.Tensor:
        """What the stand-in model writes for a block: a function of its prefix hash (and of
        the rank, whose KV heads differ from the other ranks'; MLA's latent cache is the
        same on every rank)."""
        seed = int.from_bytes(bytes(req.block_hashes[block_index])[:6], "little")
        shard = 0 if self.mla else rank
        gen = torch.Generator().manual_seed(seed + layer + 1_000_003 * shard)
        return torch.randn(*page_shape(self.mla), generator=gen).half()

    def _graph_mode(self, so: SchedulerOutput) -> str:
        """How vLLM's model runner would run this step (``graph_oracle.py``; ``NONE``
        without graphs)."""
        if self.graphs is None or not so.num_scheduled_tokens:
            return "NONE"
        return str(self.graphs(so, self.requests))

    def _compute(self, r: Rank, so: SchedulerOutput, mode: str) -> None:
        """Layer by layer, as vLLM's attention layers run (each waits for its KV first,
        unless the step replays a full CUDA graph, which runs no hook)."""
        r.layers_read = {}
        for layer, (name, t) in enumerate(r.kv.items()):
            if so.num_scheduled_tokens and mode != "FULL":
                r.worker.wait_for_layer_load(name)
                r.mover.log.append(("read", layer))
            for req_id, n in so.num_scheduled_tokens.items():
                req = self.requests[req_id]
                (block_ids,) = self.sched.kv_cache_manager.get_block_ids(req_id)
                # what attention reads: the request's earlier blocks (loaded or computed)
                computed = req.num_computed_tokens - n
                for b in range(computed // BLOCK):
                    r.layers_read[(req_id, b, layer)] = t[block_ids[b]].clone()
                # schedule() has already advanced num_computed_tokens past this step's tokens
                start, end = computed, req.num_computed_tokens
                for b in range(start // BLOCK, min(end // BLOCK, len(req.block_hashes))):
                    t[block_ids[b]] = self.page(req, b, layer, r.rank)

    def read_matches(self, req: Request, num_blocks: int) -> bool:
        """Every rank's last forward read its right bytes of the first ``num_blocks`` blocks."""
        return all(
            torch.equal(r.layers_read[(req.request_id, b, layer)], self.page(req, b, layer, r.rank))
            for r in self.ranks
            for b in range(num_blocks)
            for layer in range(LAYERS)
        )

    def loaded_blocks_match(self, req: Request, num_blocks: int) -> bool:
        """Every rank's blocks of ``req`` hold its own pages of the first ``num_blocks``."""
        (block_ids,) = self.sched.kv_cache_manager.get_block_ids(req.request_id)
        return all(
            torch.equal(t[block_ids[b]], self.page(req, b, layer, r.rank))
            for r in self.ranks
            for b in range(num_blocks)
            for layer, t in enumerate(r.kv.values())
        )

    def shutdown(self) -> None:
        """Shut every rank's worker down (their SSD stores close, their journals stay)."""
        for r in self.ranks:
            r.worker.shutdown()

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
    tp_size: int = 1,
    mla: bool = False,
    connector: str = "MiniFlexConnector",
) -> Harness:
    """``extra``: more ``kv_connector_extra_config`` keys (e.g. the SSD tier's).

    ``load_mode`` defaults to ``async``: most flows here test requests waiting
    for their load; in-step loads have tests of their own. ``cudagraphs``: a
    ``CUDAGraphMode`` name (``FULL_AND_PIECEWISE``, vLLM's default on GPUs); each
    step is then dispatched by vLLM's own CudagraphDispatcher, and a step it
    replays as a full graph calls no ``wait_for_layer_load``. ``tp_size``: that many
    workers, each with KV tensors of its own, run every plan; vLLM's
    KVOutputAggregator merges their outputs as its executor does. ``mla``: the layers
    cache one latent head (``MLAAttentionSpec``), the same bytes on every rank.
    ``connector``: the class vLLM loads from ``miniflex.connector``."""
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
        connector,
    )
    vc.parallel_config.tensor_parallel_size = vc.parallel_config.world_size = tp_size
    if cudagraphs is not None:
        capture_graphs(vc, cudagraphs)
    layers = [f"layer{i}" for i in range(LAYERS)]
    kcc = make_kv_cache_config(num_blocks, [(layers, mla_attention())] if mla else None)
    init_none_hash(sha256)
    # vLLM's order: the workers register their KV caches (and open their SSD
    # stores) before the scheduler, and so its connector, is built.
    ranks = [make_rank(vc, kcc, rank, num_blocks, mla) for rank in range(tp_size)]
    sched = Scheduler(
        vllm_config=vc,
        kv_cache_config=kcc,
        structured_output_manager=StructuredOutputManager(vc),
        block_size=BLOCK,
        log_stats=True,
    )
    graphs = graph_oracle(vc) if cudagraphs is not None else None
    return Harness(sched, ranks, {}, graphs=graphs, aggregator=aggregator(tp_size), mla=mla)


def aggregator(tp_size: int) -> Any:
    """vLLM's merger of the ranks' outputs, as its executor uses it (None for one rank)."""
    if tp_size == 1:
        return None
    from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator

    return KVOutputAggregator(tp_size)


@contextlib.contextmanager
def as_rank(rank: int) -> Iterator[None]:
    """Stand in for vLLM's tensor-parallel group: ``compat.tp_rank()`` answers ``rank``."""
    real = compat.tp_rank
    compat.tp_rank = lambda: rank
    try:
        yield
    finally:
        compat.tp_rank = real


def make_rank(vc: Any, kcc: Any, rank: int, num_blocks: int, mla: bool = False) -> Rank:
    """A worker of TP rank ``rank`` with its own KV tensors, registered as vLLM does."""
    with as_rank(rank):
        cls = getattr(miniflex.connector, vc.kv_transfer_config.kv_connector)
        worker = cls(vc, KVConnectorRole.WORKER, kcc)
        kv = {
            f"layer{i}": torch.zeros(num_blocks, *page_shape(mla), dtype=torch.float16)
            for i in range(LAYERS)
        }
        worker.register_kv_caches(kv)
    handler = worker.handler
    mover = GatedMover(handler._mover, kv, handler._store_mover)  # the real movers, pausable
    handler._mover = handler._store_mover = mover
    handler._bind_step_loads(kv)
    return Rank(rank, worker, kv, mover)
