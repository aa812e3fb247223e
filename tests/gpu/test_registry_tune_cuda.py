"""On CUDA: the registry builds the configured or tuned mover; tuning writes the cache it reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from miniflex.config import MiniFlexConfig
from miniflex.gpu import cuda_driver, pinning
from miniflex.gpu.registry import make_mover
from miniflex.gpu.tune_cache import TuneChoice, read_cache, tune_key, write_choice
from miniflex.tools.tune import Candidate, tune
from tests.gpu.conftest import HAVE_BINDINGS, HAVE_CUPY, caches, layout_of

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not (HAVE_CUPY and HAVE_BINDINGS), reason="needs CuPy and cuda-bindings"),
]


def config(tmp_path: Path, **kw: object) -> MiniFlexConfig:
    return MiniFlexConfig.from_dict({"tune_cache": str(tmp_path / "tune.json"), **kw}, env={})


def test_configured_movers_are_built(pools, tmp_path) -> None:
    kv = caches()
    layout = layout_of(kv)
    pool = pools(2, layout.geometry.slot_bytes)
    kernel = make_mover(config(tmp_path, mover="kernel", kernel_ctas=7), layout, kv, pool)
    assert type(kernel).__name__ == "KernelMover" and kernel.ctas == 7  # type: ignore[attr-defined]
    assert type(make_mover(config(tmp_path, mover="dma"), layout, kv, pool)).__name__ == "DMAMover"
    assert (
        type(make_mover(config(tmp_path, mover="cpu"), layout, kv, pool)).__name__ == "TorchMover"
    )
    staged = make_mover(config(tmp_path, mover="staged", kernel_ctas=5), layout, kv, pool)
    assert type(staged).__name__ == "StagedMover" and staged.staged_ctas == 5  # type: ignore[attr-defined]
    auto = make_mover(config(tmp_path), layout, kv, pool)  # no tuning cache yet
    assert type(auto).__name__ == "StagedMover"


def test_a_store_mover_is_the_staged_movers_direct_path(pools, tmp_path) -> None:
    """The store thread's mover: with ``staging_stores=direct`` (default) the kernel mover,
    which is how the staged mover stores, with no staging buffer; with ``lanes`` the
    staged mover, storing through its lanes."""
    kv = caches()
    layout = layout_of(kv)
    pool = pools(2, layout.geometry.slot_bytes)
    direct = make_mover(config(tmp_path, kernel_ctas=3), layout, kv, pool, stores_only=True)
    assert type(direct).__name__ == "KernelMover" and direct.ctas == 3  # type: ignore[attr-defined]
    lanes = config(tmp_path, mover="staged", staging_stores="lanes")
    staged = make_mover(lanes, layout, kv, pool, stores_only=True)
    assert type(staged).__name__ == "StagedMover" and not staged.direct_stores  # type: ignore[attr-defined]
    loads = make_mover(config(tmp_path), layout, kv, pool)
    assert type(loads).__name__ == "StagedMover" and loads.direct_stores  # type: ignore[attr-defined]


def test_auto_and_kernel_follow_the_tuning_cache(pools, tmp_path) -> None:
    kv = caches()
    layout = layout_of(kv)
    pool = pools(2, layout.geometry.slot_bytes)
    key = tune_key(torch.cuda.get_device_name(), layout)
    write_choice(tmp_path / "tune.json", key, TuneChoice("dma", ctas=12, vec=8))
    assert type(make_mover(config(tmp_path), layout, kv, pool)).__name__ == "DMAMover"
    kernel = make_mover(config(tmp_path, mover="kernel"), layout, kv, pool)
    assert (kernel.ctas, kernel.vec) == (12, 8)  # type: ignore[attr-defined]


def test_tune_times_candidates_and_saves_the_winner(tmp_path) -> None:
    model = {
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
    }
    messages: list[str] = []
    results = tune(
        model,
        chunk_tokens=(32,),
        tokens_per_call=128,
        repeat=2,
        candidates=[Candidate("kernel", 4, 16), Candidate("dma"), Candidate("cpu")],
        cache_path=tmp_path / "tune.json",
        progress=messages.append,
    )
    (r,) = results
    assert len(r.timings) == 3 and all(t.store_gbps > 0 and t.load_gbps > 0 for t in r.timings)
    assert any("dma" in m for m in messages)
    saved = read_cache(tmp_path / "tune.json")
    assert saved[r.key] == r.choice and (r.choice.ctas, r.choice.vec) == (4, 16)
    assert "32tok" in r.key and json.loads((tmp_path / "tune.json").read_text())["version"] == 1


def test_pinning_is_shared_by_movers_and_undone_once(pools, tmp_path) -> None:
    kv = caches()
    layout = layout_of(kv)
    pool = pools(2, layout.geometry.slot_bytes)
    make_mover(config(tmp_path, mover="kernel"), layout, kv, pool)
    registered = cuda_driver.ALREADY_REGISTERED
    assert cuda_driver.register(pool.address, pool.nbytes, mapped=False) == registered
    assert pinning.pin(pool.address, pool.nbytes)  # the handler's pin after make_mover
    pinning.unpin(pool.address)
    assert cuda_driver.unregister(pool.address) == cuda_driver.NOT_REGISTERED


def test_a_staging_buffer_that_does_not_fit_beside_the_kv_cache(pools, tmp_path, caplog) -> None:
    """vLLM 0.34 gives its KV cache the whole GPU by default: with too little room left, auto
    builds the kernel mover (no staging) with a warning, and mover=staged says how to make
    room; once there is room, both build the staged mover."""
    from miniflex.errors import ConfigError
    from miniflex.gpu.headroom import MARGIN, device_room

    kv = caches()
    layout = layout_of(kv)
    pool = pools(2, layout.geometry.slot_bytes)
    hog = torch.empty(
        device_room(kv[next(iter(kv))].device) - MARGIN, dtype=torch.uint8, device="cuda"
    )  # leaves less room than the staging buffer needs
    try:
        with caplog.at_level("WARNING", logger="miniflex.gpu"):
            auto = make_mover(config(tmp_path), layout, kv, pool)
        assert type(auto).__name__ == "KernelMover"
        assert "gpu-memory-utilization" in caplog.text
        with pytest.raises(ConfigError, match="staging buffer needs"):
            make_mover(config(tmp_path, mover="staged"), layout, kv, pool)
    finally:
        del hog
        torch.cuda.empty_cache()
    assert type(make_mover(config(tmp_path), layout, kv, pool)).__name__ == "StagedMover"
