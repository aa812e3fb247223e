"""When vLLM may replay a full CUDA graph (and so skip MiniFlex's per-layer hook)."""

from __future__ import annotations

from miniflex.scheduler.cuda_graphs import EAGER, GraphRule

DEFAULT = GraphRule(full_decode=True, full_mixed=False, decode_tokens=1, max_tokens=512)
FULL = GraphRule(full_decode=True, full_mixed=True, decode_tokens=1, max_tokens=512)
SPEC = GraphRule(full_decode=True, full_mixed=False, decode_tokens=3, max_tokens=512)


def test_default_mode_replays_full_graphs_for_uniform_decodes_only() -> None:
    assert DEFAULT.may_replay_full([1, 1, 1])
    assert not DEFAULT.may_replay_full([1, 1, 2])  # mixed: piecewise
    assert not DEFAULT.may_replay_full([1] * 600)  # past the largest graph: eager
    assert not DEFAULT.may_replay_full([])


def test_speculative_decoding_makes_a_decode_step_several_tokens_wide() -> None:
    assert SPEC.may_replay_full([3, 3])
    assert not SPEC.may_replay_full([1, 3])  # one request computes less: not uniform
    assert not SPEC.in_step_sees_hooks(3)
    assert SPEC.in_step_sees_hooks(4)


def test_full_mode_may_replay_any_batch_that_fits_a_graph() -> None:
    assert FULL.may_replay_full([1, 300])
    assert not FULL.may_replay_full([1, 600])
    assert not FULL.in_step_sees_hooks(10_000)  # an in-step load can never count on the hook


def test_an_in_step_load_overlaps_only_a_step_that_computes_more_than_a_decode() -> None:
    assert not DEFAULT.in_step_sees_hooks(1)
    assert DEFAULT.in_step_sees_hooks(2)
    assert EAGER.in_step_sees_hooks(1)
    assert not EAGER.may_replay_full([1, 1])
