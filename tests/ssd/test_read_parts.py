"""SSDStore reads in parts (one layer of every chunk at a time), as in-step loads read."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from miniflex.ssd import IOBackend, SSDStore
from miniflex.ssd.files import slot_parts
from miniflex.types import ChunkKey, SlotId
from tests.ssd.conftest import aligned
from tests.ssd.test_store import SLOT, chunk, open_store, random_placement, write

PART = 4096  # SLOT is 16 KiB: four parts


def test_slot_parts_cover_the_slot_once_the_last_running_to_its_end() -> None:
    assert slot_parts(16384, 4096) == [(0, 4096), (4096, 8192), (8192, 12288), (12288, 16384)]
    assert slot_parts(20480, 8192) == [(0, 8192), (8192, 20480)]  # a padded slot's tail
    assert slot_parts(16384, 0) == [(0, 16384)] == slot_parts(16384, 16384)
    with pytest.raises(ValueError, match="multiple of 4096"):
        slot_parts(16384, 1000)


def read_in_parts(store: SSDStore, placed: dict[int, int], seen: list) -> dict[int, np.ndarray]:
    """Read ``placed`` in parts; ``seen`` gets (part, every chunk's bytes of it right)."""
    bufs = {k: aligned(SLOT) for k in placed}
    bufs_ok = {k: False for k in placed}

    def on_part(p: int) -> None:
        lo, hi = p * PART, (p + 1) * PART
        seen.append((p, all(np.array_equal(bufs[k][lo:hi], chunk(k)[lo:hi]) for k in placed)))

    items = [(ChunkKey(k), SlotId(s), memoryview(bufs[k])) for k, s in placed.items()]
    for k, good in zip(placed, store.read(items, PART, on_part)[0], strict=True):
        bufs_ok[k] = good
    return {k: bufs[k] for k in placed if bufs_ok[k]}


@contextlib.contextmanager
def written_store(
    root: Path, backend: IOBackend, n: int
) -> Iterator[tuple[SSDStore, dict[int, int]]]:
    """A store with ``n`` chunks written at random slots: (store, key -> slot)."""
    with open_store(root, backend) as store:
        placed = random_placement(n, seed=n)
        assert all(write(store, placed))
        yield store, placed


def test_a_read_in_parts_lands_each_part_before_it_is_announced(
    direct_dir: Path, backend: IOBackend
) -> None:
    with written_store(direct_dir, backend, 6) as (store, placed):
        seen: list = []
        got = read_in_parts(store, placed, seen)
        assert seen == [(p, True) for p in range(SLOT // PART)]
        assert {k: np.array_equal(v, chunk(k)) for k, v in got.items()} == {k: True for k in placed}


def test_a_corrupt_part_fails_its_chunk_after_the_last_part(
    direct_dir: Path, backend: IOBackend
) -> None:
    with written_store(direct_dir, backend, 3) as (store, placed):
        bad_key, bad_slot = list(placed.items())[2]
        path, offset = store.location(SlotId(bad_slot))
        fd = os.open(path, os.O_RDWR)
        try:  # a byte of the chunk's third part
            at = offset + 2 * PART + 7
            os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0xFF]), at)
        finally:
            os.close(fd)
        seen: list = []
        got = read_in_parts(store, placed, seen)
        assert [p for p, _ in seen] == list(range(SLOT // PART))  # every part still announced
        assert set(got) == set(placed) - {bad_key}  # checked once the last part is in
        assert bad_key not in store.recovered()  # dropped: never served again
