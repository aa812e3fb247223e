"""Which engine steps may replay a full CUDA graph, and so skip MiniFlex's per-layer hook.

vLLM calls ``wait_for_layer_load`` from inside each attention layer. A step
that replays a *full* CUDA graph runs no Python between its kernels, so the
hook is skipped and a load issued for that step would race the attention that
reads it. vLLM's default, ``FULL_AND_PIECEWISE``, replays a full graph only
for a *uniform decode* batch (every request computes exactly
``1 + num_speculative_tokens`` tokens, the batch no larger than the largest
captured graph); mixed batches replay piecewise graphs, whose attention runs
eagerly, hooks included. ``FULL`` replays full graphs for mixed batches too.

MiniFlex keeps vLLM's graphs (it never asks for ``PIECEWISE``) and stays
correct with two rules, both on the scheduler side:

* an in-step load is chosen by ``load_mode=auto`` only for a request that
  computes more than a decode's worth of tokens in that step, so the step can
  never be a uniform decode (:meth:`GraphRule.in_step_sees_hooks`);
* any step that may still replay a full graph while carrying in-step loads
  (``load_mode=sync``/``layerwise`` asked for explicitly, a token budget that
  cut a request down, ``FULL`` mode) is marked in its plan
  (:meth:`GraphRule.may_replay_full`); the worker then orders the forward after
  those loads before it starts, in ``start_load_kv``, outside any graph.

Example::

    rule = GraphRule(full_decode=True, full_mixed=False, decode_tokens=1, max_tokens=512)
    rule.may_replay_full([1, 1, 1])   # True: a uniform decode batch
    rule.may_replay_full([1, 900])    # False: mixed, piecewise graphs
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["EAGER", "GraphRule"]


@dataclass(frozen=True)
class GraphRule:
    """When vLLM replays full CUDA graphs (read from its config by ``compat.graph_rule``)."""

    full_decode: bool
    """Uniform decode batches replay full graphs."""
    full_mixed: bool
    """Any batch up to ``max_tokens`` may replay a full graph (``CUDAGraphMode.FULL``)."""
    decode_tokens: int = 1
    """Tokens a request computes in a decode step: 1 + speculative tokens."""
    max_tokens: int = 0
    """The largest captured batch in tokens; larger steps run eagerly."""

    def may_replay_full(self, scheduled_tokens: Sequence[int]) -> bool:
        """Whether a step computing ``scheduled_tokens`` (one entry per request) may replay a
        full graph, skipping ``wait_for_layer_load``. Errs on the side of True."""
        total = sum(scheduled_tokens)
        if total == 0 or total > self.max_tokens:
            return False
        if self.full_mixed:
            return True
        q = self.decode_tokens
        uniform = max(scheduled_tokens) == q and total == q * len(scheduled_tokens)
        return self.full_decode and uniform

    def in_step_sees_hooks(self, new_tokens: int) -> bool:
        """Whether a step in which a request computes ``new_tokens`` is sure to call the
        per-layer hook (so a layerwise load can overlap that computation)."""
        return not self.full_mixed and (not self.full_decode or new_tokens > self.decode_tokens)


EAGER = GraphRule(full_decode=False, full_mixed=False)
"""No full graphs (``enforce_eager``, ``PIECEWISE``, or a backend without graphs)."""
