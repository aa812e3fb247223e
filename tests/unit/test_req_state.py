"""ReqState's parts and its invariant: ChunkKeys in step with vLLM's hashes, one load at most,
and an account whose total is the sum of its tiers."""

from __future__ import annotations

import numpy as np
import pytest

from miniflex.index import keys_to_array
from miniflex.keys import Namespace, chunk_key
from miniflex.plan import JobId
from miniflex.scheduler.chunk_keys import ChunkKeys
from miniflex.scheduler.requests import PendingLoad, ReqState
from miniflex.types import ReqId

NS = Namespace("m", "bfloat16", "LBHNC", 2, 2, 64, block_size=16, blocks_per_chunk=2)
HASHES = [bytes([i + 1]) * 32 for i in range(10)]  # 10 blocks: 5 chunks
KEYS = [chunk_key(NS, HASHES[2 * i + 1]) for i in range(5)]


def test_chunk_keys_follow_the_hashes_as_a_list_and_as_the_index_array() -> None:
    keys = ChunkKeys()
    assert keys.sync(NS, HASHES[:5]) == 0 and list(keys) == KEYS[:2]  # a partial chunk: none
    assert keys.sync(NS, HASHES) == 2 and list(keys) == KEYS
    assert np.array_equal(keys.array, keys_to_array(KEYS))
    assert keys[1] == KEYS[1] and keys[3:] == KEYS[3:]
    keys.check()


def test_chunk_keys_drop_what_follows_a_rewritten_hash() -> None:
    keys = ChunkKeys()
    keys.sync(NS, HASHES)
    tail = [bytes([0xF0 + i]) * 32 for i in range(6)]  # blocks 4 on replaced
    assert keys.sync(NS, [*HASHES[:4], *tail]) == 2  # chunks 0 and 1 still vouched for
    fresh = [chunk_key(NS, h) for h in tail[1::2]]
    assert list(keys) == [*KEYS[:2], *fresh]
    assert np.array_equal(keys.array, keys_to_array([*KEYS[:2], *fresh]))
    assert keys.sync(NS, HASHES[:2]) == 1 and list(keys) == KEYS[:1]  # the prompt shrank
    keys.check()


def test_chunk_keys_check_catches_an_array_out_of_step() -> None:
    keys = ChunkKeys()
    keys.sync(NS, HASHES)
    keys.array = keys.array[:3]
    with pytest.raises(AssertionError, match="5 keys, 5 sources, 3 rows"):
        keys.check()


def test_a_request_holds_one_load_at_most_pending_or_sent() -> None:
    st = ReqState(ReqId("r"))
    st.check()
    st.load = PendingLoad(0, 32, [])
    st.check()
    st.load_job = JobId(7)
    with pytest.raises(AssertionError, match="two loads"):
        st.check()
    st.load = None
    st.load_job_sync = True
    st.check()
    st.load_job = None
    with pytest.raises(AssertionError, match="sync of none"):
        st.check()


def test_the_account_total_is_the_sum_of_its_tiers() -> None:
    st = ReqState(ReqId("r"))
    st.account.credit({"cpu": 64, "ssd": 32})
    st.account.credit({"ssd": 32})
    assert st.account.hit_by_tier == {"cpu": 64, "ssd": 64}
    st.check()
    params = st.finished_params()["miniflex"]
    assert params["hit_tokens"] == 128 and params["hit_tokens_ssd"] == 64
    st.account.hit_tokens += 1
    with pytest.raises(AssertionError, match="hit 129 tokens"):
        st.check()
