"""The key helpers of ``miniflex/index/key_words.py``: 128-bit keys as two uint64 words."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miniflex.index import array_to_keys, keys_to_array, split_key
from tests.unit.test_hashindex import WORD, any_key, edge_key


@given(st.lists(st.one_of(any_key, edge_key), max_size=50))
@settings(max_examples=50, deadline=None)
def test_keys_round_trip_through_word_arrays(ks: list[int]) -> None:
    arr = keys_to_array(ks)
    assert arr.dtype == np.uint64 and arr.shape == (len(ks), 2)
    assert arr.flags.c_contiguous
    assert array_to_keys(arr) == ks
    for k, (hi, lo) in zip(ks, arr.tolist(), strict=True):
        assert split_key(k) == (hi, lo)
        assert hi * WORD + lo == k


def test_keys_to_array_accepts_numpy_integers_and_rejects_non_integers() -> None:
    assert keys_to_array([np.uint64(3), np.int64(4)]).tolist() == [[0, 3], [0, 4]]
    with pytest.raises(TypeError, match="position 0"):
        keys_to_array([1.0])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="shape"):
        array_to_keys(np.zeros(4, dtype=np.uint64))
