"""A LoRA adapter's weights in the chunk keys of the requests that use it.

A chunk key comes from vLLM's chained block hash (:func:`miniflex.keys.chunk_key`).
vLLM folds an adapter's name (and, from 0.32, its path) into that hash, not its
weights: an adapter re-trained and written over the same directory gets the same
hashes, and a restart over the same SSD directory or remote store would serve KV
computed with the old weights. So for a request with an adapter, MiniFlex keys
its chunks from the block hashes salted with the adapter's identity
(:func:`miniflex.model_identity.adapter_identity`: its ``adapter_config.json`` and
weight files), each hash salted only when a key is derived from it.

Requests without an adapter use vLLM's hashes as they are, and KV events always
carry vLLM's own hashes (a router matches them against the GPU's events).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, overload

from miniflex.connector import compat
from miniflex.model_identity import adapter_identity

__all__ = ["SaltedHashes", "adapter_salt", "chunk_hashes"]


def adapter_salt(request: Any) -> bytes:
    """16 bytes naming the request's LoRA adapter's weights; empty without an adapter.
    Hashes the adapter's files once per process, again only when one changes."""
    lora = getattr(request, "lora_request", None)
    if lora is None:
        return b""
    return bytes.fromhex(adapter_identity(str(lora.lora_path)))


class SaltedHashes(Sequence[bytes]):
    """A request's block hashes, each keyed with ``salt`` as it is read."""

    def __init__(self, hashes: Sequence[bytes], salt: bytes) -> None:
        self._hashes = hashes
        self._salt = salt

    def __len__(self) -> int:
        return len(self._hashes)

    @overload
    def __getitem__(self, i: int) -> bytes: ...
    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...
    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        raw = bytes(self._hashes[i])
        return hashlib.blake2b(raw, digest_size=16, key=self._salt).digest()


def chunk_hashes(request: Any) -> Sequence[bytes]:
    """The hashes MiniFlex derives ``request``'s chunk keys from (see the module docstring)."""
    hashes = compat.block_hashes(request)
    salt = adapter_salt(request)
    return SaltedHashes(hashes, salt) if salt else hashes
