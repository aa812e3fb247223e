"""The tuning cache: keys per GPU/layout/chunk size, atomic writes, readable errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from miniflex.errors import ConfigError
from miniflex.gpu.tune_cache import TuneChoice, lookup, read_cache, tune_key, write_choice
from miniflex.layout import KVGeometry, KVLayout


def layout(chunk_blocks: int = 4, order: str = "LBHNC", pad: int = 0) -> KVLayout:
    g = KVGeometry(36, 8, 128, 16, "bfloat16", 2, chunk_blocks)
    return KVLayout(g, order, num_blocks=1000, block_stride=g.page_bytes + pad)


def test_key_names_gpu_layout_chunk_size_and_padding() -> None:
    key = tune_key("NVIDIA H200", layout())
    assert key == "NVIDIA H200|LBHNC|L36xH8xD128xN16|bfloat16|64tok|dense"
    others = {
        tune_key("NVIDIA H100", layout()),
        tune_key("NVIDIA H200", layout(chunk_blocks=8)),
        tune_key("NVIDIA H200", layout(order="LBNHC")),
        tune_key("NVIDIA H200", layout(pad=64)),
    }
    assert key not in others and len(others) == 4


def test_missing_file_is_an_empty_cache(tmp_path: Path) -> None:
    assert read_cache(tmp_path / "nope.json") == {}
    assert lookup(tmp_path / "nope.json", "k") is None


def test_writes_add_and_replace_entries_and_leave_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "tune.json"  # parent directories are created
    write_choice(path, "a", TuneChoice("kernel", ctas=16, vec=16, store_gbps=50.0, load_gbps=49.0))
    write_choice(path, "b", TuneChoice("dma"))
    write_choice(path, "a", TuneChoice("kernel", ctas=8, vec=16))
    assert read_cache(path) == {
        "a": TuneChoice("kernel", ctas=8, vec=16),
        "b": TuneChoice("dma"),
    }
    assert lookup(path, "b") == TuneChoice("dma")
    assert [p.name for p in path.parent.iterdir()] == ["tune.json"]
    assert json.loads(path.read_text())["version"] == 1


def test_a_damaged_file_is_reported_not_ignored(tmp_path: Path) -> None:
    path = tmp_path / "tune.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match=r"tune_cache.*not JSON") as err:
        read_cache(path)
    assert err.value.key == "tune_cache"
    path.write_text(json.dumps({"version": 99, "entries": {}}))
    with pytest.raises(ConfigError, match="version is 99"):
        read_cache(path)
    path.write_text(json.dumps({"version": 1, "entries": {"k": {"mover": "warp"}}}))
    with pytest.raises(ConfigError, match="bad entry"):
        lookup(path, "k")


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "tune.json"
    write_choice(path, "a", TuneChoice("dma"))
    before = path.read_text()
    with pytest.raises(TypeError):
        write_choice(path, "b", TuneChoice("kernel", ctas=object()))  # type: ignore[arg-type]
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["tune.json"]
