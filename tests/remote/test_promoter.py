"""Promoter over a replicated (MLA) pool: rank 0 fetches into the slot all ranks map and
publishes each chunk; rank 1 waits for that and takes only what arrived."""

from __future__ import annotations

from pathlib import Path

import pytest

from miniflex.errors import TransferError
from miniflex.plan import RemoteCopy, SlotCopy
from miniflex.remote.fetch import RemoteFetcher
from miniflex.remote.local_server import LocalServer
from miniflex.shared_pool import SharedPool
from miniflex.types import SlotId
from miniflex.worker.promotions import Promoter
from tests.remote.conftest import key, payload, store

SLOT = 4096


def test_rank0_publishes_every_fetch_and_rank1_takes_only_what_arrived(
    tmp_path: Path, server: LocalServer
) -> None:
    rank0 = SharedPool(4, SLOT, tmp_path / "pool", ranks=2)
    rank1 = SharedPool(4, SLOT, tmp_path / "pool", ranks=2)
    with store(server.url) as s:
        assert s.put(key(1), payload(SLOT, 1))  # key(2) is not in the store
        reads = [RemoteCopy(key(1), SlotId(0)), RemoteCopy(key(2), SlotId(1))]
        failed, ssd_s, remote_s = Promoter(None, rank0, True, RemoteFetcher(s, rank0)).promote(
            7, (), reads
        )
        assert failed == {key(2)} and ssd_s == 0.0 and remote_s > 0
        seen, waited, _ = Promoter(None, rank1, writes=False).promote(7, (), reads)
        assert seen == {key(2)} and waited < 5  # published, not waited out
        assert bytes(rank1.slot(SlotId(0))) == payload(SLOT, 1)  # rank 0's fetch, mapped
    rank0.close()
    rank1.close()


def test_a_rank_without_the_tier_a_job_needs_refuses_it(tmp_path: Path) -> None:
    pool = SharedPool(2, SLOT, tmp_path / "pool", ranks=1)
    p = Promoter(None, pool, writes=True)
    with pytest.raises(TransferError, match="ssd_dirs"):
        p.promote(1, [SlotCopy(key(1), SlotId(0), SlotId(0))])
    with pytest.raises(TransferError, match="remote_url"):
        p.promote(1, (), [RemoteCopy(key(1), SlotId(0))])
    pool.close()
