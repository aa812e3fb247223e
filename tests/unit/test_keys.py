"""Chunk keys: prefix chaining, chunk boundaries and namespace isolation."""

from __future__ import annotations

import dataclasses
import hashlib

from miniflex.keys import Namespace, chunk_key, chunk_keys_from_tokens

NS = Namespace(
    model="tiny",
    dtype="float16",
    layout="LBNHC",
    num_layers=2,
    num_kv_heads=2,
    head_size=64,
    block_size=32,
    blocks_per_chunk=2,
)


def test_one_key_per_full_chunk_only() -> None:
    assert len(chunk_keys_from_tokens(NS, list(range(64 * 3 + 10)))) == 3
    assert chunk_keys_from_tokens(NS, list(range(63))) == []


def test_keys_are_128_bit_and_chain_over_the_prefix() -> None:
    a = chunk_keys_from_tokens(NS, list(range(256)))
    b = chunk_keys_from_tokens(NS, [*range(64), 999, *range(65, 256)])
    assert all(0 <= k < 2**128 for k in a)
    assert a[0] == b[0]
    # one changed token changes every later key
    assert all(x != y for x, y in zip(a[1:], b[1:], strict=True))


def test_shared_prefix_gives_shared_leading_keys() -> None:
    prefix = list(range(128))
    a = chunk_keys_from_tokens(NS, [*prefix, *range(1000, 1128)])
    b = chunk_keys_from_tokens(NS, [*prefix, *range(2000, 2128)])
    assert a[:2] == b[:2] and a[2:] != b[2:]


def test_every_namespace_field_changes_the_keys() -> None:
    tokens = list(range(128))
    base = chunk_keys_from_tokens(NS, tokens)
    changes = {
        "model": "other",
        "dtype": "bfloat16",
        "layout": "LBHNC",
        "num_layers": 3,
        "num_kv_heads": 4,
        "head_size": 128,
        "tp_size": 2,
        "latent": True,
        "replicated": True,
        "format_version": 99,
        "kv_group": "model.layers.0.attn",
    }
    for field, value in changes.items():
        other = dataclasses.replace(NS, **{field: value})
        assert chunk_keys_from_tokens(other, tokens) != base, field


def test_a_namespace_of_one_kv_group_keeps_the_keys_it_had_before_the_field() -> None:
    # the digest as it was derived before kv_group existed: every other field, in order
    fields = [f for f in dataclasses.fields(NS) if f.name != "kv_group"]
    text = "|".join(f"{f.name}={getattr(NS, f.name)}" for f in fields)
    before = hashlib.blake2b(text.encode(), digest_size=16).digest()
    assert NS.digest == before
    assert NS.kv_group == "" and chunk_key(NS, b"h" * 32) != chunk_key(
        dataclasses.replace(NS, kv_group="model.layers.0.attn"), b"h" * 32
    )


def test_a_block_hash_key_is_scoped_by_the_namespace() -> None:
    a, b = (hashlib.sha256(bytes([i])).digest() for i in range(2))
    assert chunk_key(NS, a) == chunk_key(NS, a) != chunk_key(NS, b)
    assert chunk_key(dataclasses.replace(NS, model="other"), a) != chunk_key(NS, a)


def test_every_rank_has_the_same_keys_but_its_own_shard_digest() -> None:
    """One plan drives every TP rank (same keys); each rank's bytes are its own shard."""
    tp2 = dataclasses.replace(NS, tp_size=2)
    rank0, rank1 = tp2.shard(0), tp2.shard(1)
    assert chunk_keys_from_tokens(rank0, list(range(128))) == chunk_keys_from_tokens(
        rank1, list(range(128))
    )
    assert rank0.digest != rank1.digest
    assert rank0.key_digest == rank1.key_digest


def test_a_replicated_cache_has_one_shard_for_every_rank() -> None:
    mla = dataclasses.replace(NS, tp_size=2, latent=True, replicated=True)
    assert mla.shard(1).digest == mla.shard(0).digest == mla.digest
