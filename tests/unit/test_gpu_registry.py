"""The mover registry without a GPU: the torch mover, and readable errors for CUDA movers."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from miniflex.config import MiniFlexConfig
from miniflex.errors import ConfigError
from miniflex.gpu import pinning
from miniflex.gpu.cpu_mover import TorchMover
from miniflex.gpu.registry import MOVERS, cuda_mover_problem, make_mover
from miniflex.gpu.synthetic import synthetic_caches
from miniflex.layout import KVGeometry, layout_from_tensors
from miniflex.pool import HostPool


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


@pytest.fixture
def cpu_cache():
    g = KVGeometry(2, 2, 16, 4, "bfloat16", 2, 2)
    kv = synthetic_caches(g, "LBHNC", 16, "cpu")
    layout = layout_from_tensors(kv, 2)
    pool = HostPool(4, layout.geometry.slot_bytes)
    yield layout, kv, pool
    pool.close()


def config(tmp_path: Path, mover: str) -> MiniFlexConfig:
    return MiniFlexConfig.from_dict(
        {"mover": mover, "tune_cache": str(tmp_path / "t.json")}, env={}
    )


@pytest.mark.parametrize("mover", ["auto", "cpu"])
def test_cpu_kv_cache_gets_the_torch_mover(cpu_cache, tmp_path, mover) -> None:
    layout, kv, pool = cpu_cache
    assert isinstance(make_mover(config(tmp_path, mover), layout, kv, pool), TorchMover)


@pytest.mark.parametrize("mover", ["kernel", "dma", "staged"])
def test_cuda_movers_on_a_cpu_kv_cache_are_a_config_error(cpu_cache, tmp_path, mover) -> None:
    layout, kv, pool = cpu_cache
    with pytest.raises(ConfigError, match=r"host memory.*'cpu' mover") as err:
        make_mover(config(tmp_path, mover), layout, kv, pool)
    assert (err.value.key, err.value.value) == ("mover", mover)


def test_every_configurable_mover_is_registered() -> None:
    assert MOVERS == ("auto", "cpu", "kernel", "dma", "staged")


@pytest.mark.skipif(_importable("cupy"), reason="CuPy is installed here")
def test_missing_cupy_is_named_with_the_package_to_install() -> None:
    assert "cupy-cuda13x" in (cuda_mover_problem("kernel", on_cuda=True) or "")


@pytest.mark.skipif(_importable("cuda.bindings"), reason="cuda-bindings is installed here")
def test_missing_cuda_bindings_is_named_with_the_package_to_install() -> None:
    assert "cuda-bindings" in (cuda_mover_problem("dma", on_cuda=True) or "")


def test_importing_the_gpu_package_loads_no_cuda_library() -> None:
    """CI has no GPU: CuPy and cuda.bindings are imported only when a CUDA mover is built."""
    code = (
        "import sys, miniflex.gpu.registry, miniflex.gpu.kernel_mover, miniflex.gpu.dma_mover, "
        "miniflex.gpu.staged_mover, "
        "miniflex.tools.tune, miniflex.gpu.pinning, miniflex.tools.cli; "
        "print(sorted(m for m in sys.modules if m.startswith(('cupy', 'cuda.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_pinning_without_cuda_reports_unpinned(cpu_cache) -> None:
    _, _, pool = cpu_cache
    assert pinning.pin(pool.address, pool.nbytes, mapped=True) is False
    pinning.unpin(pool.address)  # a no-op, not an error
