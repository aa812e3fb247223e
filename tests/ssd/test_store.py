"""SSDStore scenarios: round trips over two disks, reopen, foreign layouts, corruption, failures."""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from miniflex.errors import ConfigError
from miniflex.ssd import IOBackend, SSDStore
from miniflex.types import ChunkKey, SlotId
from tests.conftest import MountFS
from tests.ssd.conftest import aligned, random_bytes

SLOT = 16 << 10
NUM_SLOTS = 40
DIGEST = bytes(range(16))


def chunk(key: int) -> np.ndarray:
    """The bytes chunk ``key`` holds in every test: reproducible noise seeded by the key."""
    return random_bytes(SLOT, seed=key)


def open_store(
    root: Path, backend: IOBackend, digest: bytes = DIGEST, slot: int = SLOT
) -> SSDStore:
    dirs = [root / "a", root / "b"]
    for d in dirs:
        d.mkdir(exist_ok=True)
    return SSDStore([str(d) for d in dirs], NUM_SLOTS * SLOT, slot, digest, backend)


def write(store: SSDStore, placed: dict[int, int]) -> list[bool]:
    bufs = {k: chunk(k) for k in placed}
    return store.write([(ChunkKey(k), SlotId(s), memoryview(bufs[k])) for k, s in placed.items()])


def read_back(store: SSDStore, placed: dict[int, int]) -> dict[int, bool]:
    """key -> read succeeded *and* the bytes are the key's own."""
    bufs = {k: aligned(SLOT) for k in placed}
    ok, _ = store.read([(ChunkKey(k), SlotId(s), memoryview(bufs[k])) for k, s in placed.items()])
    return {
        k: good and np.array_equal(bufs[k], chunk(k)) for k, good in zip(placed, ok, strict=True)
    }


@pytest.fixture
def store(direct_dir: Path, backend: IOBackend) -> Iterator[SSDStore]:
    s = open_store(direct_dir, backend)
    yield s
    s.close()


def random_placement(n: int, seed: int) -> dict[int, int]:
    rng = np.random.default_rng(seed)
    slots = rng.permutation(NUM_SLOTS)[:n]
    return {int.from_bytes(rng.bytes(16), "little"): int(s) for s in slots}


def test_round_trip_across_two_dirs_then_reopen(
    store: SSDStore, direct_dir: Path, backend: IOBackend
) -> None:
    assert store.num_slots == NUM_SLOTS
    assert {store.location(SlotId(s))[0] for s in range(2)} == {
        str(direct_dir / d / "miniflex-slots.dat") for d in "ab"
    }
    placed = random_placement(30, seed=1)
    first, second = dict(list(placed.items())[:12]), dict(list(placed.items())[12:])
    assert write(store, first) == [True] * 12
    assert write(store, second) == [True] * 18
    assert all(read_back(store, placed).values())
    store.close()
    with open_store(direct_dir, backend) as again:
        assert again.recovered() == placed
        assert all(read_back(again, placed).values())


@pytest.mark.parametrize("change", ["namespace", "slot_size"])
def test_other_namespace_or_slot_size_recovers_nothing(
    store: SSDStore, direct_dir: Path, backend: IOBackend, change: str
) -> None:
    placed = random_placement(8, seed=2)
    assert all(write(store, placed))
    store.close()
    digest = bytes(16) if change == "namespace" else DIGEST
    slot = SLOT * 2 if change == "slot_size" else SLOT
    with open_store(direct_dir, backend, digest, slot) as other:
        assert other.recovered() == {}
        # The old bytes are gone from the files, not merely unlisted.
        for key, s in placed.items():
            path, offset = other.location(SlotId(s))
            with open(path, "rb") as f:
                f.seek(offset)
                assert f.read(8) != chunk(key)[:8].tobytes()
    with open_store(direct_dir, backend) as original:  # the old journal was replaced
        assert original.recovered() == {}
        assert not any(read_back(original, placed).values())


def test_corrupt_chunk_is_never_served_and_is_dropped(
    store: SSDStore, direct_dir: Path, backend: IOBackend
) -> None:
    placed = random_placement(3, seed=3)
    assert all(write(store, placed))
    bad_key, bad_slot = list(placed.items())[1]
    path, offset = store.location(SlotId(bad_slot))
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([os.pread(fd, 1, offset + 100)[0] ^ 0xFF]), offset + 100)
    finally:
        os.close(fd)
    assert read_back(store, placed) == {k: k != bad_key for k in placed}
    assert bad_key not in store.recovered()
    store.close()
    with open_store(direct_dir, backend) as again:
        assert again.recovered() == {k: s for k, s in placed.items() if k != bad_key}


def test_overwritten_slot_maps_only_the_new_key(
    store: SSDStore, direct_dir: Path, backend: IOBackend
) -> None:
    assert write(store, {11: 3, 12: 4}) == [True, True]
    assert write(store, {21: 3}) == [True]
    assert read_back(store, {11: 3, 21: 3, 12: 4}) == {11: False, 21: True, 12: True}
    store.close()
    with open_store(direct_dir, backend) as again:
        assert again.recovered() == {21: 3, 12: 4}
        assert all(read_back(again, {21: 3, 12: 4}).values())


def test_failed_writes_are_false_and_not_journaled(
    store: SSDStore, direct_dir: Path, backend: IOBackend
) -> None:
    """Writes beyond RLIMIT_FSIZE fail with EFBIG: a stand-in for a disk that errors."""
    placed = {1: 0, 2: 1, 3: 4, 4: 2, 5: 7}  # slots 4 and 7 sit at offset 2*SLOT
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2 * SLOT, hard))
    try:
        ok = write(store, placed)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert ok == [True, True, False, True, False]
    good = {k: s for k, s in placed.items() if k not in (3, 5)}
    assert store.recovered() == good
    assert write(store, {3: 4}) == [True]  # the store still works
    store.close()
    with open_store(direct_dir, backend) as again:
        assert again.recovered() == {**good, 3: 4}
        assert all(read_back(again, {**good, 3: 4}).values())


def test_unknown_key_or_wrong_slot_reads_false(store: SSDStore) -> None:
    assert write(store, {7: 5}) == [True]
    assert read_back(store, {8: 5}) == {8: False}  # another key's slot
    assert read_back(store, {7: 6}) == {7: False}  # the key, but not at that slot
    assert read_back(store, {7: 5}) == {7: True}
    assert store.recovered() == {7: 5}  # a miss is not corruption: nothing dropped


def test_bad_arguments_raise(store: SSDStore) -> None:
    buf = memoryview(chunk(1))
    with pytest.raises(ValueError, match="twice"):
        store.write([(ChunkKey(1), SlotId(0), buf), (ChunkKey(2), SlotId(0), buf)])
    with pytest.raises(ValueError, match="outside"):
        store.write([(ChunkKey(1), SlotId(NUM_SLOTS), buf)])
    with pytest.raises(ValueError, match="not 16384"):
        store.read([(ChunkKey(1), SlotId(0), buf[:4096])])


def test_config_errors_name_the_problem(direct_dir: Path, backend: IOBackend) -> None:
    d = str(direct_dir)
    with pytest.raises(ConfigError, match="existing, writable directory"):
        SSDStore([str(direct_dir / "missing")], NUM_SLOTS * SLOT, SLOT, DIGEST, backend)
    with pytest.raises(ConfigError, match="distinct"):
        SSDStore([d, d + "/."], NUM_SLOTS * SLOT, SLOT, DIGEST, backend)
    with pytest.raises(ConfigError, match="one 16384-byte slot per dir"):
        SSDStore([d], SLOT - 1, SLOT, DIGEST, backend)
    with pytest.raises(ConfigError, match="multiple of 4096"):
        SSDStore([d], NUM_SLOTS * SLOT, SLOT + 1, DIGEST, backend)
    with SSDStore([d], NUM_SLOTS * SLOT, SLOT, DIGEST, backend) as first:
        with pytest.raises(ConfigError, match="a live MiniFlex store uses it"):
            SSDStore([d], NUM_SLOTS * SLOT, SLOT, DIGEST, backend)
        assert first.num_slots == NUM_SLOTS
        assert os.stat(first.location(SlotId(0))[0]).st_mode & 0o777 == 0o600


@pytest.fixture
def tiny_fs(mount_fs: MountFS) -> Path:
    """A loop-mounted 8 MiB ext4 (root only; skipped where mounting is not allowed)."""
    return mount_fs(8)


def test_full_disk_fails_writes_cleanly_and_keeps_acknowledged_ones(
    tiny_fs: Path, backend: IOBackend
) -> None:
    """Data slots are preallocated, so ENOSPC hits the journal: nothing half-journaled."""
    dirs, slot = [str(tiny_fs)], 4096
    with SSDStore(dirs, 400 * slot, slot, DIGEST, backend) as store:
        filler = os.open(tiny_fs / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        with pytest.raises(OSError, match="No space left"):
            while True:
                os.write(filler, bytes(1 << 16))
        buf = memoryview(aligned(slot))
        acked: dict[int, int] = {}
        results = []
        for batch in range(40):  # ~85 records fill the journal's first 4 KiB block
            placed = {batch * 10 + i + 1: batch * 10 + i for i in range(10)}
            ok = store.write([(ChunkKey(k), SlotId(s), buf) for k, s in placed.items()])
            results.append(all(ok))
            acked.update(placed if all(ok) else {})
            if not any(ok):
                break
        assert results[0] and results[-1] is False, results
        assert store.recovered() == acked
        os.close(filler)
        os.unlink(tiny_fs / "filler")
        retry = {10_000 + i: s for i, s in enumerate(placed.values())}
        assert all(store.write([(ChunkKey(k), SlotId(s), buf) for k, s in retry.items()]))
    with SSDStore(dirs, 400 * slot, slot, DIGEST, backend) as again:
        assert again.recovered() == {**acked, **retry}


def test_a_store_sharing_any_directory_with_a_live_one_is_refused(
    direct_dir: Path, backend: IOBackend
) -> None:
    a, b, c = (direct_dir / n for n in "abc")
    for d in (a, b, c):
        d.mkdir()
    live = SSDStore([str(a), str(b)], NUM_SLOTS * SLOT, SLOT, DIGEST, backend)
    with live, pytest.raises(ConfigError, match=f"ssd_dirs='{b}'.*a live MiniFlex store uses it"):
        SSDStore([str(c), str(b)], NUM_SLOTS * SLOT, SLOT, DIGEST, backend)
    assert os.listdir(c) == []  # the refused store removed the file it had locked


def test_a_failed_start_leaves_nothing_behind(tiny_fs: Path, backend: IOBackend) -> None:
    with pytest.raises(OSError, match="more are needed"):
        SSDStore([str(tiny_fs)], 64 << 20, SLOT, DIGEST, backend)  # 64 MiB on an 8 MiB disk
    assert sorted(os.listdir(tiny_fs)) == ["lost+found"]
