"""How vLLM's model runner would run a step under CUDA graphs, asked of vLLM's own code.

The flow tests need an oracle that is not MiniFlex's: which steps replay a
full graph (no ``wait_for_layer_load``), which run piecewise graphs (hooks run),
which run eagerly. vLLM 0.26-0.33 answer it with the V1 runner's
``CudagraphDispatcher``; 0.34 removed that runner, and its V2 runner's
``CudaGraphManager`` answers it (built without a GPU: no pipeline group, no
graph pool; its descriptors are taken as captured).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from unittest import mock

from miniflex.connector import compat
from miniflex.scheduler.requests import ScheduledReq

__all__ = ["graph_oracle"]

Oracle = Callable[[Any, Mapping[str, Any]], str]
"""(a SchedulerOutput, the requests by id) -> the mode's name (``NONE``: eager)."""


def graph_oracle(vc: Any) -> Oracle:
    """The oracle of this vLLM for ``vc`` (its ``compilation_config`` as a GPU sets it)."""
    try:
        from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
    except ImportError:
        return _v2_oracle(vc)
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    dispatcher = CudagraphDispatcher(vc)
    dispatcher.initialize_cudagraph_keys(vc.compilation_config.cudagraph_mode, 1)

    def v1(so: Any, requests: Mapping[str, Any]) -> str:
        n = list(so.num_scheduled_tokens.values())
        q = dispatcher.uniform_decode_query_len
        uniform = GPUModelRunner._is_uniform_decode(max(n), q, sum(n), len(n))
        mode, _ = dispatcher.dispatch(sum(n), uniform_decode=uniform)
        return str(mode.name)

    return v1


def _v2_oracle(vc: Any) -> Oracle:
    import torch
    from vllm.v1.worker.gpu import cudagraph_utils as cu
    from vllm.v1.worker.utils import get_uniform_decode_token_count

    cc = vc.compilation_config
    cc.prefill_cudagraph_capture_token_sizes = list(cc.cudagraph_capture_sizes)
    cc.decode_cudagraph_capture_request_sizes = list(cc.cudagraph_capture_sizes)
    q = vc.uniform_decode_query_len
    pp = mock.Mock(is_first_rank=True, is_last_rank=True)
    with (
        mock.patch.object(cu, "get_pp_group", return_value=pp),
        mock.patch.object(cu.current_platform, "get_global_graph_pool", return_value=None),
    ):
        manager = cu.CudaGraphManager(
            vc, torch.device("cpu"), cc.cudagraph_mode, {q: vc.scheduler_config.max_num_seqs}
        )
    manager._graphs_captured = True  # what a GPU runner has after its warm-up

    def v2(so: Any, requests: Mapping[str, Any]) -> str:
        # the V2 runner's test: no request prefills, but for a one-token extension of a
        # prefill already begun (a hit loaded all but its last token)
        def decode_like(s: ScheduledReq) -> bool:
            done, new = s.num_computed_tokens, s.num_scheduled_tokens
            prefilling = done < requests[s.req_id].num_prompt_tokens
            return not prefilling or (new == 1 and done > 0)

        scheduled = compat.scheduled_requests(so)
        n = [s.num_scheduled_tokens for s in scheduled]
        eligible = all(decode_like(s) for s in scheduled)
        uniform = get_uniform_decode_token_count(len(n), sum(n), max(n), eligible)
        desc = manager.dispatch(len(n), sum(n), uniform, 0, max_query_len=max(n))
        return str(desc.cg_mode.name)

    return v2
