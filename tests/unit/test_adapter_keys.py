"""A LoRA adapter's weights in its requests' chunk keys: new weights, new keys."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from miniflex.connector.adapter_keys import SaltedHashes, adapter_salt, chunk_hashes
from miniflex.keys import Namespace, chunk_key
from miniflex.model_identity import adapter_identity

NS = Namespace("m", "bfloat16", "LBHNC", 2, 2, 64, 16, 2)
HASHES = [bytes([i]) * 32 for i in range(8)]
WRITES: list[Path] = []


@dataclass
class LoRA:
    lora_path: str


@dataclass
class Request:
    block_hashes: list[bytes]
    lora_request: LoRA | None = None


def write_adapter(path: Path, weights: bytes, rank: int = 8) -> Path:
    """Files with a new modification time each call, even within one clock tick (a process
    hashes an adapter again when a file's size or modification time changes)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": 16}))
    (path / "adapter_model.safetensors").write_bytes(weights)
    WRITES.append(path)
    for f in path.iterdir():
        os.utime(f, ns=(len(WRITES), len(WRITES)))
    return path


def keys(request: Request) -> list[int]:
    hashes = chunk_hashes(request)
    return [chunk_key(NS, bytes(hashes[i * 2 - 1])) for i in range(1, len(hashes) // 2 + 1)]


def test_a_request_without_an_adapter_keys_from_vllms_own_hashes() -> None:
    plain = Request(HASHES)
    assert chunk_hashes(plain) is plain.block_hashes and adapter_salt(plain) == b""


def test_new_weights_or_config_at_the_same_path_give_new_keys(tmp_path: Path) -> None:
    path = write_adapter(tmp_path / "a", b"w" * 4096)
    request = Request(HASHES, LoRA(str(path)))
    before = keys(request)
    assert before == keys(Request(HASHES, LoRA(str(path))))  # stable
    assert set(before).isdisjoint(keys(Request(HASHES)))  # not the base model's
    write_adapter(path, b"v" * 4096)  # re-trained, written over the same directory
    retrained = keys(request)
    assert set(retrained).isdisjoint(before)
    write_adapter(path, b"v" * 4096, rank=16)
    assert set(keys(request)).isdisjoint(retrained)


def test_salted_hashes_read_as_a_sequence_and_follow_rewritten_hashes() -> None:
    raw = list(HASHES)
    salted = SaltedHashes(raw, b"s" * 16)
    assert len(salted) == 8 and salted[1:3] == [salted[1], salted[2]]
    assert len(set(salted[:])) == 8 and not set(salted[:]) & set(raw)
    assert SaltedHashes(raw, b"t" * 16)[0] != salted[0]
    old = salted[7]
    raw[7] = b"x" * 32  # vLLM rewrote the tail (a streaming-input session)
    assert salted[7] != old


def test_an_adapter_that_is_not_here_is_named_by_its_path(tmp_path: Path) -> None:
    assert adapter_identity("org/adapter-a") != adapter_identity("org/adapter-b")
    assert adapter_identity("org/adapter-a") == adapter_identity("org/adapter-a")
