"""The model's identity in every key: what changes KV changes it, nothing else does."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from miniflex.keys import Namespace, chunk_keys_from_tokens
from miniflex.model_identity import WHOLE_FILE_BYTES, model_identity

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "num_key_value_heads": 2,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0",
    "_name_or_path": "/somewhere",
}


def write_model(path: Path, config: dict | None = None, weights: bytes = b"w" * 4096) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config or CONFIG))
    (path / "model.safetensors").write_bytes(weights)
    return path


def edit_config(path: Path, **changes: object) -> None:
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **changes}))
    os.utime(path / "config.json", ns=(1, 1))  # a new stamp even within one clock tick


def test_a_copy_elsewhere_is_the_same_model(tmp_path: Path) -> None:
    a = write_model(tmp_path / "a")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    edit_config(b, _name_or_path="/elsewhere", transformers_version="4.57.1")
    assert model_identity(str(a)) == model_identity(str(b))
    assert model_identity(str(a)) == model_identity(str(a))


@pytest.mark.parametrize(
    "change",
    [
        {"rope_theta": 1000000.0},
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
        {"rms_norm_eps": 1e-6},
        {"partial_rotary_factor": 0.5},
    ],
)
def test_a_config_change_that_keeps_the_shapes_is_another_model(
    tmp_path: Path, change: dict
) -> None:
    model = write_model(tmp_path / "m")
    before = model_identity(str(model))
    edit_config(model, **change)
    assert model_identity(str(model)) != before


def test_other_weights_of_the_same_shape_are_another_model(tmp_path: Path) -> None:
    model = write_model(tmp_path / "m", weights=bytes(4096))
    before = model_identity(str(model))
    weights = bytearray(4096)
    weights[2049] = 1  # one byte of a small file
    (model / "model.safetensors").write_bytes(bytes(weights))
    os.utime(model / "model.safetensors", ns=(2, 2))
    assert model_identity(str(model)) != before


def test_a_large_weight_file_is_sampled_at_its_edges_and_inside(tmp_path: Path) -> None:
    model = write_model(tmp_path / "m")
    big = model / "model-00001-of-00002.safetensors"
    size = 4 * WHOLE_FILE_BYTES
    with big.open("wb") as f:
        f.truncate(size)
    first = model_identity(str(model))
    for at, stamp in ((0, 3), (size - 1, 4)):  # the first and the last MiB are read whole
        with big.open("r+b") as f:
            f.seek(at)
            f.write(b"\x01")
        os.utime(big, ns=(stamp, stamp))
        now = model_identity(str(model))
        assert now != first
        first = now


def test_the_settings_that_change_kv_change_it_and_order_does_not(tmp_path: Path) -> None:
    model = str(write_model(tmp_path / "m"))
    base = {"kv_cache_dtype": "auto", "hf_overrides": {"a": 1, "b": 2}}
    same = {"hf_overrides": {"b": 2, "a": 1}, "kv_cache_dtype": "auto"}
    assert model_identity(model, None, base) == model_identity(model, None, same)
    for change in ({"kv_cache_dtype": "fp8"}, {"hf_overrides": {"rope_theta": 5e5}}):
        assert model_identity(model, None, {**base, **change}) != model_identity(model, None, base)
    assert model_identity(model, "v2", base) != model_identity(model, None, base)


def test_a_callable_setting_is_named_not_addressed(tmp_path: Path) -> None:
    model = str(write_model(tmp_path / "m"))

    def override(config: object) -> object:
        return config

    first = model_identity(model, None, {"hf_overrides": override})
    assert first == model_identity(model, None, {"hf_overrides": override})
    assert first != model_identity(model, None, {"hf_overrides": lambda c: c})


def test_a_repo_id_is_its_cached_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--org--name"

    def snapshot(commit: str, config: dict) -> None:
        write_model(repo / "snapshots" / commit, config)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(commit)

    assert model_identity("org/name") == model_identity("org/name")  # nothing cached
    snapshot("a" * 40, CONFIG)
    first = model_identity("org/name")
    snapshot("b" * 40, CONFIG)  # a new commit: new weights, as far as anyone here knows
    assert model_identity("org/name") != first
    assert model_identity("org/name", "a" * 40) != model_identity("org/name", "b" * 40)


def test_the_identity_changes_every_key_and_digest() -> None:
    args = ("m", "bfloat16", "LBNHC", 4, 2, 64, 16, 4)
    one, two = Namespace(*args, model_digest="1"), Namespace(*args, model_digest="2")
    assert one.digest != two.digest and one.key_digest != two.key_digest
    tokens = list(range(64))
    assert chunk_keys_from_tokens(one, tokens) != chunk_keys_from_tokens(two, tokens)


def test_lookahead_block_hashes_are_part_of_the_model_identity(tmp_path: Path) -> None:
    """vLLM 0.34's lookahead hashes cover tokens after each block: an engine hashing that
    way must not share chunks with one that does not (and without them keys stay as before)."""
    from types import SimpleNamespace

    from miniflex.connector.compat import model_digest

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 64}))

    def config(**extra: object) -> SimpleNamespace:
        mc = SimpleNamespace(model=str(model), dtype="bfloat16", revision=None)
        return SimpleNamespace(model_config=mc, cache_config=SimpleNamespace(), **extra)

    plain = model_digest(config())
    assert model_digest(config(num_hash_lookahead_tokens=0)) == plain
    assert model_digest(config(num_hash_lookahead_tokens=3)) != plain
