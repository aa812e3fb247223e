"""stream_slots: which pools get staging slots for streamed SSD reads and remote fetches."""

from __future__ import annotations

import tempfile

from miniflex.config import MiniFlexConfig
from miniflex.pool import MAX_STREAM_SLOTS, stream_slots
from miniflex.ranks import TPPlacement

SLOT = 1 << 20
SSD = tempfile.gettempdir()  # an existing directory: nothing is opened in it


def _config(**kw: object) -> MiniFlexConfig:
    return MiniFlexConfig.from_dict({"cpu_bytes": "64MiB", **kw})


def test_a_pool_of_its_own_gets_staging_slots_for_ssd_or_remote_tiers() -> None:
    for tiers in ({"ssd_dirs": SSD}, {"remote_url": "redis://127.0.0.1:1"}):
        config = _config(**tiers, ssd_stream_bytes=8 * SLOT)
        for placement in (TPPlacement(1), TPPlacement(2), TPPlacement(1, replicated=True)):
            assert stream_slots(config, SLOT, placement) == 8, (tiers, placement)


def test_an_mla_cache_at_tp1_streams_but_one_that_ranks_share_does_not() -> None:
    config = _config(ssd_dirs=SSD, ssd_stream_bytes=8 * SLOT)
    assert stream_slots(config, SLOT, TPPlacement(1, replicated=True)) == 8  # its own pool
    assert stream_slots(config, SLOT, TPPlacement(2, replicated=True)) == 0  # rank 0 publishes


def test_no_slots_without_a_tier_below_cpu_or_when_turned_off_and_2_to_64_otherwise() -> None:
    assert stream_slots(_config(), SLOT, TPPlacement(1)) == 0
    assert stream_slots(_config(ssd_dirs=SSD, ssd_stream_bytes=0), SLOT, TPPlacement(1)) == 0
    tiny = _config(ssd_dirs=SSD, ssd_stream_bytes=SLOT // 2)
    assert stream_slots(tiny, SLOT, TPPlacement(1)) == 2  # a ring of one cannot overlap
    huge = _config(ssd_dirs=SSD, ssd_stream_bytes=1000 * SLOT)
    assert stream_slots(huge, SLOT, TPPlacement(1)) == MAX_STREAM_SLOTS
