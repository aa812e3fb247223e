"""What each KV cache group of a hybrid model needs of a prefix (``miniflex/hybrid.py``)."""

from __future__ import annotations

from miniflex.hybrid import GroupNeed, longest_hit

BLOCK, CHUNK, WINDOW = 32, 64, 128
FULL, SLIDING = GroupNeed(), GroupNeed(WINDOW)


def test_the_docstring_example() -> None:
    assert FULL.needed_chunks(960, CHUNK) == range(15)
    assert SLIDING.needed_chunks(960, CHUNK) == range(13, 15)
    assert SLIDING.needed_blocks(0, 960, BLOCK) == range(26, 30)
    assert FULL.needed_blocks(320, 960, BLOCK) == range(10, 30)  # after vLLM's own hit
    assert SLIDING.needed_blocks(900 // BLOCK * BLOCK, 960, BLOCK) == range(28, 30)


def test_a_window_longer_than_the_prefix_needs_all_of_it() -> None:
    assert SLIDING.needed_chunks(96, CHUNK) == range(2)
    assert SLIDING.kept_chunks(2, CHUNK) == range(2)


def test_kept_chunks_serve_every_hit_that_ends_in_the_last_chunk() -> None:
    for done in range(1, 20):
        kept = SLIDING.kept_chunks(done, CHUNK)
        for end in range((done - 1) * CHUNK + BLOCK, done * CHUNK + 1, BLOCK):
            assert set(SLIDING.needed_chunks(end, CHUNK)) <= set(kept), (done, end)
        assert len(kept) <= WINDOW // CHUNK + 2  # the window's, not the prefix's
    assert FULL.kept_chunks(7, CHUNK) == range(7)


def stored_as_computed(steps: list[int]) -> dict[int, set[int]]:
    """What each group stores when a prompt's computation ends its steps at these chunk
    counts: full attention everything, the sliding group each step's kept chunks."""
    held: dict[int, set[int]] = {0: set(), 1: set()}
    for done in steps:
        held[0] |= set(FULL.kept_chunks(done, CHUNK))
        held[1] |= set(SLIDING.kept_chunks(done, CHUNK))
    return held


def test_a_prompt_stored_in_one_step_hits_in_full_and_stores_only_its_last_window() -> None:
    held = stored_as_computed([15])  # a 1000-token prompt: 15 full chunks
    assert held[1] == {12, 13, 14}
    hit = longest_hit([FULL, SLIDING], lambda g, c: c in held[g], 15, 999, CHUNK, BLOCK)
    assert hit == 960
    # the same prefix with 24 more tokens (one block before the end): the same hit
    assert longest_hit([FULL, SLIDING], lambda g, c: c in held[g], 16, 1023, CHUNK, BLOCK) == 960


def test_a_hit_stops_where_a_group_lacks_its_window() -> None:
    held = stored_as_computed([5, 10, 15])  # chunked prefill: boundaries at 5, 10, 15
    held[1].discard(13)  # evicted from the sliding group
    hit = longest_hit([FULL, SLIDING], lambda g, c: c in held[g], 15, 999, CHUNK, BLOCK)
    assert hit == 10 * CHUNK  # the window before chunk 10 was kept when it was computed
    assert longest_hit([FULL, SLIDING], lambda g, c: False, 15, 999, CHUNK, BLOCK) == 0
