"""What each KV cache group of a hybrid model needs of a prefix (groundwork, not served yet).

With vLLM's hybrid KV cache manager on, the layers of a Gemma-3 / gpt-oss style
model form several KV cache groups, each with a block table of its own:

* a full-attention group needs every token of the prefix;
* a sliding-window group of window ``W`` needs, to compute from token ``end``
  on, only tokens ``[end - W + 1, end)`` (vLLM's ``get_num_skipped_tokens``).
  vLLM puts its null block in that group's table before them, both for the
  blocks of an external hit and, while a request runs, for blocks that leave
  the window (it frees those at the next schedule).

So a hit ending at ``end`` holds for a model only when every group has what it
needs; and a sliding-window group only ever needs to keep, of a stored prefix,
the chunks that the window before one of its hit boundaries reads.

Worked example: 32-token blocks, 64-token chunks, a 128-token window, a hit
ending at token 960. The full group reads chunks 0-14 (blocks 0-29); the
sliding group reads tokens 833-959, i.e. chunks 13-14, and a load fills only
its blocks 26-29 (blocks 0-25 are vLLM's null block).

``tests/connector/test_hybrid_groups.py`` checks these ranges against vLLM's
own scheduler. The data path (per-group chunk moves, a mover per group's
layers, window stores) is what docs/design/hybrid.md lists under "Limits".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["GroupNeed", "longest_hit"]


@dataclass(frozen=True)
class GroupNeed:
    """How much of a prefix one KV cache group reads: all of it, or a sliding window."""

    window: int | None = None
    """Tokens a layer of the group attends to (None: full attention)."""

    def first_needed_token(self, end: int) -> int:
        """The first token whose KV computing from token ``end`` on reads."""
        return 0 if self.window is None else max(0, end - self.window + 1)

    def needed_blocks(self, start: int, end: int, block_size: int) -> range:
        """Block indices of tokens ``[start, end)`` (``end`` a block boundary) that a load
        into this group must fill; vLLM's null blocks before the window are left out."""
        assert end % block_size == 0, f"a hit ends on a block boundary, not at {end}"
        return range(max(start, self.first_needed_token(end)) // block_size, end // block_size)

    def needed_chunks(self, end: int, chunk_tokens: int) -> range:
        """Chunk indices a hit ending at token ``end`` reads from this group."""
        return range(self.first_needed_token(end) // chunk_tokens, -(-end // chunk_tokens))

    def kept_chunks(self, done_chunks: int, chunk_tokens: int) -> range:
        """Chunks to store once the prefix's first ``done_chunks`` chunks are computed:
        every one for full attention; for a window, those a hit ending anywhere in the
        last chunk reads (a hit may end up to a chunk before the boundary: vLLM computes
        at least the prompt's last token). A chunk left out of one step's range is left
        out of every later one, so a step stores only chunks it computed itself."""
        if self.window is None:
            return range(done_chunks)
        end = max(0, (done_chunks - 1) * chunk_tokens + 1)
        return range(self.first_needed_token(end) // chunk_tokens, done_chunks)


def longest_hit(
    groups: Sequence[GroupNeed],
    held: Callable[[int, int], bool],
    num_chunks: int,
    cap: int,
    chunk_tokens: int,
    block_size: int,
) -> int:
    """The longest hit, in tokens, for which every group holds what it needs.

    ``held(g, c)``: group ``g`` holds chunk ``c``; ``num_chunks``: the prompt's full
    chunks; ``cap``: the most tokens a hit may cover (vLLM computes the prompt's last
    token: ``num_tokens - 1``), cut to whole blocks. 0: no hit.
    """
    for n in range(num_chunks, 0, -1):
        end = min(n * chunk_tokens, cap // block_size * block_size)
        if end <= 0:
            continue
        if all(
            held(g, c)
            for g, need in enumerate(groups)
            for c in need.needed_chunks(end, chunk_tokens)
        ):
            return end
    return 0
