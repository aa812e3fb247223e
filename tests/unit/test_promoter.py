"""Promoter's SSD promotions on a real SSD store (its remote fetches: tests/remote): a sharded
rank reads its own chunks; a replicated pool's rank 0 reads and publishes each slot, and the
other ranks take only the slots published good."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from miniflex.config import MiniFlexConfig
from miniflex.errors import TransferError
from miniflex.plan import SlotCopy
from miniflex.pool import HostPool
from miniflex.shared_pool import SharedPool
from miniflex.ssd.copier import SSDCopier
from miniflex.types import ChunkKey, SlotId
from miniflex.worker.promotions import Promoter

SLOT = 8192
SLOTS = 4
GOOD, OTHER, MISSING = ChunkKey(0xA1), ChunkKey(0xA2), ChunkKey(0xA3)


def payload(seed: int) -> bytes:
    return random.Random(seed).randbytes(SLOT)


def on_ssd(pool: HostPool, direct_dir: Path) -> SSDCopier:
    """A store holding GOOD in SSD slot 0 and OTHER in SSD slot 1 (written from the pool's
    slots 0 and 1, which are then wiped)."""
    config = MiniFlexConfig(ssd_dirs=(str(direct_dir),), ssd_bytes=1 << 20, ssd_io="threads")
    copier = SSDCopier(config, pool, bytes(16))
    pool.slot(SlotId(0))[:] = memoryview(payload(1))
    pool.slot(SlotId(1))[:] = memoryview(payload(2))
    writes = [SlotCopy(GOOD, SlotId(0), SlotId(0)), SlotCopy(OTHER, SlotId(1), SlotId(1))]
    assert copier.demote(writes) == set()
    pool.array[:] = 0
    return copier


@pytest.fixture
def sharded(direct_dir: Path) -> Iterator[tuple[HostPool, SSDCopier]]:
    pool = HostPool(SLOTS, SLOT)
    copier = on_ssd(pool, direct_dir)
    yield pool, copier
    copier.close()
    pool.close()


@pytest.fixture
def replicated(
    tmp_path: Path, direct_dir: Path
) -> Iterator[tuple[SharedPool, SharedPool, SSDCopier]]:
    """Rank 0's and rank 1's mappings of one pool; rank 0's SSD store."""
    rank0 = SharedPool(SLOTS, SLOT, tmp_path / "pool", ranks=2)
    rank1 = SharedPool(SLOTS, SLOT, tmp_path / "pool", ranks=2)
    copier = on_ssd(rank0, direct_dir)
    yield rank0, rank1, copier
    copier.close()
    rank0.close()
    rank1.close()


def test_a_sharded_rank_reads_each_promotion_into_its_cpu_slot(sharded) -> None:
    pool, copier = sharded
    reads = [SlotCopy(GOOD, SlotId(2), SlotId(0)), SlotCopy(OTHER, SlotId(3), SlotId(1))]
    failed, _ssd_s, remote_s = Promoter(copier, None, writes=True).promote(1, reads)
    assert failed == set() and remote_s == 0.0
    assert bytes(pool.slot(SlotId(2))) == payload(1)
    assert bytes(pool.slot(SlotId(3))) == payload(2)


def test_a_chunk_the_store_does_not_hold_is_returned_failed_and_the_rest_read(sharded) -> None:
    pool, copier = sharded
    reads = [SlotCopy(GOOD, SlotId(2), SlotId(0)), SlotCopy(MISSING, SlotId(3), SlotId(2))]
    failed, _, _ = Promoter(copier, None, writes=True).promote(1, reads)
    assert failed == {MISSING}
    assert bytes(pool.slot(SlotId(2))) == payload(1)


def test_a_chunk_at_another_ssd_slot_than_journaled_is_not_served(sharded) -> None:
    _, copier = sharded
    wrong_slot = [SlotCopy(GOOD, SlotId(2), SlotId(1))]  # OTHER's slot
    failed, _, _ = Promoter(copier, None, writes=True).promote(1, wrong_slot)
    assert failed == {GOOD}


def test_rank0_publishes_each_promotion_and_rank1_takes_only_the_good_ones(replicated) -> None:
    rank0, rank1, copier = replicated
    reads = [SlotCopy(GOOD, SlotId(2), SlotId(0)), SlotCopy(MISSING, SlotId(3), SlotId(2))]
    failed, _, _ = Promoter(copier, rank0, writes=True).promote(7, reads)
    assert failed == {MISSING}
    seen, _waited, remote_s = Promoter(None, rank1, writes=False).promote(7, reads)
    assert seen == {MISSING} and remote_s == 0.0
    assert bytes(rank1.slot(SlotId(2))) == payload(1)  # rank 0's read, mapped


def test_a_publication_of_an_earlier_job_is_not_taken_for_this_one(replicated) -> None:
    rank0, rank1, copier = replicated
    reads = [SlotCopy(GOOD, SlotId(2), SlotId(0))]
    Promoter(copier, rank0, writes=True).promote(7, reads)
    assert not rank1.wait_published(SlotId(2), 8, timeout_s=0.0)  # job 8's read: not yet
    assert rank1.wait_published(SlotId(2), 7, timeout_s=0.0)


def test_a_rank_without_an_ssd_tier_refuses_a_promotion_and_never_publishes_it_good(
    replicated,
) -> None:
    rank0, rank1, _ = replicated
    reads = [SlotCopy(GOOD, SlotId(2), SlotId(0))]
    with pytest.raises(TransferError, match="ssd_dirs"):
        Promoter(None, rank0, writes=True).promote(3, reads)
    assert not rank1.wait_published(SlotId(2), 3, timeout_s=0.0)


def test_a_read_that_raises_publishes_every_slot_failed(replicated) -> None:
    rank0, rank1, copier = replicated
    reads = [SlotCopy(GOOD, SlotId(2), SlotId(999))]  # no such SSD slot: the read raises
    with pytest.raises(ValueError, match="outside"):
        Promoter(copier, rank0, writes=True).promote(5, reads)
    seen, _, _ = Promoter(None, rank1, writes=False).promote(5, reads)
    assert seen == {GOOD}  # rank 1 must not copy a slot rank 0 never read into
