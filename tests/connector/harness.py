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

import torch
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from miniflex.connector import MiniFlexConnector
from miniflex.gpu.base import KVMover
from miniflex.plan import ChunkMove

BLOCK, HEADS, HEAD, LAYERS = 16, 2, 8, 2


class GatedMover(KVMover):
    """Wraps the real mover; clearing ``gate`` makes transfers wait so tests act mid-flight."""

    def __init__(self, inner: KVMover) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.gate.set()

    def store(self, chunks: Sequence[ChunkMove], after: object = None) -> int:
        self.gate.wait()
        return self.inner.store(chunks, after)

    def load(self, chunks: Sequence[ChunkMove], after: object = None) -> int:
        self.gate.wait()
        return self.inner.load(chunks, after)

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
        out = KVConnectorOutput(
            finished_sending=sending,
            finished_recving=recving,
            invalid_block_ids=self.worker.get_block_ids_with_load_errors(),
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
            stats = eco.scheduler_stats.kv_connector_stats if eco.scheduler_stats else None
            if stats:
                self.kv_stats.append(stats)
        return so

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

    def _compute(self, so: SchedulerOutput) -> None:
        for r, n in so.num_scheduled_tokens.items():
            req = self.requests[r]
            (block_ids,) = self.sched.kv_cache_manager.get_block_ids(r)
            # schedule() has already advanced num_computed_tokens past this step's tokens
            start, end = req.num_computed_tokens - n, req.num_computed_tokens
            for b in range(start // BLOCK, min(end // BLOCK, len(req.block_hashes))):
                for layer, t in enumerate(self.kv.values()):
                    t[block_ids[b]] = self.page(req, b, layer)

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
) -> Harness:
    """``extra``: more ``kv_connector_extra_config`` keys (e.g. the SSD tier's)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,'
        f' "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": {HEADS},'
        f' "num_hidden_layers": {LAYERS}, "head_dim": {HEAD}, "vocab_size": 1000,'
        ' "max_position_embeddings": 4096, "torch_dtype": "float16"}'
    )
    mc = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="float16", seed=0)
    sc = SchedulerConfig(
        max_num_seqs=8,
        max_num_batched_tokens=max_batched,
        max_model_len=2048,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    cc = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    kt = KVTransferConfig(
        kv_connector="MiniFlexConnector",
        kv_connector_module_path="miniflex.connector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "cpu_bytes": cpu_bytes,
            "blocks_per_chunk": blocks_per_chunk,
            **(extra or {}),
        },
    )
    vc = VllmConfig(
        model_config=mc,
        scheduler_config=sc,
        cache_config=cc,
        kv_transfer_config=kt,
        device_config=DeviceConfig("cpu"),
    )
    vc.cache_config.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float16
    )
    kcc = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([f"layer{i}" for i in range(LAYERS)], spec)],
    )
    kcc.kv_cache_layout = "LBHNC"
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
    mover = GatedMover(handler._mover)  # the real mover, made pausable
    handler._mover = mover
    return Harness(sched, worker, kv, mover, {})
