"""vLLM's hybrid KV cache manager and MiniFlex: which connector keeps it, what each refuses.

``MiniFlexHMAConnector`` is a ``SupportsHMA`` connector: vLLM keeps its hybrid KV
cache manager and finishes requests through ``request_finished_all_groups``.
``MiniFlexConnector`` is not: vLLM turns the manager off and promotes sliding-window
layers to full attention (served whole). Mamba/linear-attention models are refused
by both, before vLLM groups their layers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.platforms import current_platform
from vllm.v1.request import RequestStatus

from miniflex.connector import MiniFlexConnector, MiniFlexHMAConnector, compat
from miniflex.connector.hma_groups import MiniFlexGroupsConnector
from miniflex.errors import ConfigError
from tests.conftest import MountFS
from tests.connector.engine_config import (
    BLOCK,
    HEAD,
    HEADS,
    full_attention,
    make_kv_cache_config,
    make_vllm_config,
    tokens,
    write_model_config,
)
from tests.connector.harness import Harness, make_harness
from tests.connector.stats_sum import totals

CHUNK = 2 * BLOCK
HMA = "MiniFlexHMAConnector"


def needs_hma() -> None:
    if compat.hma_base() is None:
        pytest.skip("this vLLM has no SupportsHMA: it never keeps the manager for a connector")


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    needs_hma()
    return make_harness(tmp_path / "model", connector=HMA)


def test_vllm_keeps_its_hybrid_manager_only_for_the_hma_connector(tmp_path: Path) -> None:
    needs_hma()
    if not current_platform.support_hybrid_kv_cache():
        pytest.skip(f"vLLM's {current_platform.device_name} platform never keeps the manager")
    model = write_model_config(tmp_path / "model")
    extra = {"cpu_bytes": "1MiB"}
    plain = make_vllm_config(model, extra, connector="MiniFlexConnector")
    hma = make_vllm_config(model, extra, connector=HMA)
    assert plain.scheduler_config.disable_hybrid_kv_cache_manager is True
    assert hma.scheduler_config.disable_hybrid_kv_cache_manager is False


def test_blocks_of_a_request_finished_with_stores_in_flight_wait_for_them(h: Harness) -> None:
    """vLLM hands the finished request's blocks per group; MiniFlex holds them until its
    stores are done, and the stored bytes come back exactly for the next request."""
    conn = h.manager_side
    assert isinstance(conn, MiniFlexHMAConnector)
    calls: list[tuple[list[int], ...]] = []
    real = conn.request_finished_all_groups

    def spy(request: Any, block_ids: tuple[list[int], ...]) -> tuple[bool, dict | None]:
        calls.append(block_ids)
        return real(request, block_ids)

    conn.request_finished_all_groups = spy  # type: ignore[method-assign]
    prompt = tokens(4, 3 * CHUNK + 3)
    total = h.free_blocks()
    h.mover.gate.clear()
    h.add("a", prompt, max_tokens=1)
    h.step(wait_transfers=False)  # prefill + sample: finished, its stores still queued
    assert h.status("a") == RequestStatus.FINISHED_LENGTH_CAPPED
    assert len(calls) == 1 and len(calls[0]) == 1  # one call, one group's block ids
    assert len(calls[0][0]) == -(-(len(prompt) + 1) // BLOCK)
    assert not h.finished_and_freed("a") and h.free_blocks() < total
    h.mover.gate.set()
    h.run()
    assert h.finished_and_freed("a") and h.free_blocks() == total
    assert h.params["a"]["miniflex"]["stored_tokens"] == 3 * CHUNK
    assert totals(h.kv_stats)["blocks_held_requests"] == 1

    assert h.sched.reset_prefix_cache()
    b = h.add("b", prompt, max_tokens=2)
    h.step(wait_transfers=False)
    assert h.status("b") == RequestStatus.WAITING_FOR_REMOTE_KVS
    h.worker.handler.drain()
    h.step()  # the load's completion reaches the scheduler
    so = h.step()  # b is scheduled with the loaded prefix as computed
    assert {r.req_id: r.num_computed_tokens for r in so.scheduled_new_reqs} == {"b": 3 * CHUNK}
    assert h.loaded_blocks_match(b, 3 * CHUNK // BLOCK)
    h.run()
    assert h.params["b"]["miniflex"]["hit_tokens"] == 3 * CHUNK
    assert h.free_blocks() == total


def sliding_window() -> Any:
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    return SlidingWindowSpec(
        block_size=BLOCK,
        num_kv_heads=HEADS,
        head_size=HEAD,
        dtype=torch.float16,
        sliding_window=2 * BLOCK,
    )


def groups_config(tmp_path: Path, extra: dict) -> tuple[Any, Any]:
    """What vLLM's manager builds for a Gemma-3 / gpt-oss style model: a sliding-window
    group and a full-attention group of as many layers."""
    model = write_model_config(tmp_path / "model")
    vc = make_vllm_config(
        model, {"cpu_bytes": "1MiB", "blocks_per_chunk": 2, **extra}, connector=HMA
    )
    groups = [
        (["model.layers.0.attn"], sliding_window()),
        (["model.layers.1.attn"], full_attention()),
    ]
    return vc, make_kv_cache_config(64, groups)


@pytest.mark.parametrize("role", [KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER])
def test_sliding_and_full_groups_get_one_miniflex_per_group(
    tmp_path: Path, role: KVConnectorRole
) -> None:
    needs_hma()
    vc, kcc = groups_config(tmp_path, {})
    conn = MiniFlexHMAConnector(vc, role, kcc)
    assert isinstance(conn, MiniFlexGroupsConnector)
    assert [n.window for n in conn.needs] == [2 * BLOCK, None] and conn.main == 1
    assert all(p.config.cpu_bytes == 2**19 and p.config.load_mode == "async" for p in conn.parts)


def needs_failed_recving() -> None:
    needs_hma()
    if compat.transfer_results_class() is None:
        pytest.skip("vLLM before 0.30 cannot be told a group's load failed: SSD is refused")


@pytest.mark.parametrize("tier", ["ssd_dirs", "remote_url"])
def test_before_vllm_0_30_a_hybrid_model_gets_no_ssd_or_remote_tier(
    tmp_path: Path, tier: str
) -> None:
    needs_hma()
    if compat.transfer_results_class() is not None:
        pytest.skip("this vLLM reports a failed load by request (failed_recving)")
    value = str(tmp_path) if tier == "ssd_dirs" else "redis://127.0.0.1:1"
    vc, kcc = groups_config(tmp_path, {tier: value})
    with pytest.raises(ConfigError, match=r"need vLLM 0\.30 or newer"):
        MiniFlexHMAConnector(vc, KVConnectorRole.SCHEDULER, kcc)


def test_each_group_gets_an_ssd_store_of_its_own(tmp_path: Path) -> None:
    needs_failed_recving()
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    vc, kcc = groups_config(tmp_path, {"ssd_dirs": str(ssd), "ssd_bytes": "4MiB"})
    conn = MiniFlexHMAConnector(vc, KVConnectorRole.SCHEDULER, kcc)
    dirs = [p.config.ssd_dirs for p in conn.parts]
    assert dirs == [(str(ssd / "group0"),), (str(ssd / "group1"),)]
    assert all((ssd / f"group{g}").is_dir() for g in range(2))
    assert all(p.config.ssd_bytes == 2 << 20 for p in conn.parts)


def test_the_groups_ssd_stores_are_checked_together_before_any_is_made(
    tmp_path: Path, mount_fs: MountFS
) -> None:
    """Each group's share (8 MiB) fits the 16 MiB disk; both together do not."""
    needs_failed_recving()
    small = mount_fs(16)
    vc, kcc = groups_config(tmp_path, {"ssd_dirs": str(small), "ssd_bytes": "16MiB"})
    with pytest.raises(ConfigError, match=r"ssd_bytes.*needs"):
        MiniFlexHMAConnector(vc, KVConnectorRole.WORKER, kcc)
    assert not [p for p in small.rglob("*") if p.is_file()]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"blocks_per_chunk": 4}, "must fit in the sliding window"),
        ({"ssd_dirs": "/nonexistent/ssd"}, "/nonexistent/ssd. is not an existing directory"),
    ],
)
def test_bad_settings_for_several_groups_are_refused(
    tmp_path: Path, extra: dict, says: str
) -> None:
    needs_hma()
    vc, kcc = groups_config(tmp_path, extra)
    with pytest.raises(ConfigError, match=says):
        MiniFlexHMAConnector(vc, KVConnectorRole.SCHEDULER, kcc)


GRANITE_HYBRID = {
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "model_type": "granitemoehybrid",
    "layer_types": ["mamba", "attention"],
    "num_hidden_layers": 2,
    "shared_intermediate_size": 64,
    "num_local_experts": 0,
    "num_experts_per_tok": 0,
    "mamba_n_heads": 4,
    "mamba_d_head": 16,
    "mamba_n_groups": 1,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 64,
    "position_embedding_type": "rope",
}


@pytest.mark.parametrize("cls", [MiniFlexConnector, MiniFlexHMAConnector])
def test_a_mamba_hybrid_is_refused_before_vllm_groups_its_layers(tmp_path: Path, cls: type) -> None:
    """vLLM asks the connector class for its KV layout before it builds the KV cache
    groups; a model with Mamba layers gets MiniFlex's reason there, not vLLM's failure to
    unify the layers' specs. A model of attention layers (sliding-window ones too) passes."""
    extra = {"cpu_bytes": "1MiB"}
    mamba = write_model_config(tmp_path / "granite", **GRANITE_HYBRID)
    with pytest.raises(ConfigError) as err:
        cls.get_required_kvcache_layout(make_vllm_config(mamba, extra))
    message = str(err.value)
    assert f"model='{mamba}'" in message
    assert "GraniteMoeHybridForCausalLM has Mamba/linear-attention layers" in message
    assert "running state per request" in message

    sliding = write_model_config(
        tmp_path / "sliding",
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=2 * BLOCK,
    )
    assert cls.get_required_kvcache_layout(make_vllm_config(sliding, extra)) == "HND"


def test_group_block_ids_keeps_every_group_in_order() -> None:
    assert compat.group_block_ids(([3, 4], [0, 9])) == ([3, 4], [0, 9])
    assert json.dumps(compat.group_block_ids(([1],))) == "[[1]]"
