"""The soak's re-reads: after damaging chunks on SSD, ask for exactly the prompts that hold them.

The server's per-request trace (MiniFlex's ``trace_file``) names each prompt's
chunk keys in order, and where each request's chunks came from. A
``kill_corrupt`` round uses it twice:

* before damaging bytes, :meth:`Rereads.pick` chooses chunks that a restarted
  server will read: on SSD (its journal lists them) behind a prefix whose every
  chunk is on SSD too, no two of them in one prompt (a request stops reading at
  its first bad chunk);
* after the restart, :meth:`Rereads.ask` sends one prompt per damaged chunk, one
  at a time, and :meth:`Rereads.report` reads the trace lines written since:
  every damaged chunk still reachable (journal damage may have dropped it or its
  prefix) must show there as ``failed``, i.e. its checksum caught it.

Example::

    rereads = Rereads(rank_dir, trace_file)
    slots = rereads.pick(count=8, seed=3)         # slots to damage
    ...                                          # damage them and the journal; restart
    outcomes = rereads.ask(load)                 # the prompts that hold them
    rereads.report()  # {"damaged_reachable": 8, "damaged_caught": 8, "damaged_unread": 0, ...}
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

from miniflex.bench.soak_load import Load, Outcome, prompt_of
from miniflex.ssd.journal import journal_geometry, read_journal
from miniflex.ssd.store import JOURNAL_FILE

__all__ = ["Rereads", "live_slots", "prompt_keys"]


def live_slots(rank_dir: str) -> dict[str, int]:
    """The chunks a store's journal lists: key (32 hex digits, as the trace writes it) ->
    slot."""
    journal = os.path.join(rank_dir, JOURNAL_FILE)
    geometry = journal_geometry(journal)
    if geometry is None:
        return {}
    entries = read_journal(journal, *geometry)
    return {f"{key:032x}": int(entry[0]) for key, entry in entries.items()}


def trace_lines(path: str, start: int = 0) -> list[dict[str, Any]]:
    """The whole lines of the trace from byte ``start`` on (a line cut by a kill is left)."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    return [json.loads(line) for line in data.split(b"\n")[:-1] if line.strip()]


def prompt_keys(lines: list[dict[str, Any]]) -> dict[int, list[str]]:
    """Each soak prompt's chunk keys, in order, from the trace."""
    out: dict[int, list[str]] = {}
    for line in lines:
        prompt = prompt_of(line["request"])
        if prompt is not None:
            out[prompt] = [c["key"] for c in line["chunks"]]
    return out


class Rereads:
    """Chooses the chunks a ``kill_corrupt`` round damages, and checks they are caught."""

    def __init__(self, rank_dir: str, trace_file: str) -> None:
        self.rank_dir, self.trace_file = rank_dir, trace_file
        self.damaged: dict[str, int] = {}  # key -> the prompt that reads it
        self._prompts: dict[int, list[str]] = {}
        self._start = 0

    def pick(self, count: int, seed: int) -> list[int]:
        """Up to ``count`` slots to damage (see the module docstring)."""
        self._prompts = prompt_keys(trace_lines(self.trace_file))
        live = live_slots(self.rank_dir)
        candidates = sorted(_reachable(self._prompts, live).items())
        random.Random(seed).shuffle(candidates)
        taken: set[int] = set()  # prompts holding a chosen chunk
        for key, prompt in candidates:
            holders = {p for p, keys in self._prompts.items() if key in keys}
            if len(self.damaged) < count and not holders & taken:
                self.damaged[key] = prompt
                taken |= holders
        return sorted(live[k] for k in self.damaged)

    def restarting(self) -> None:
        """The server restarts on the damaged store: what the trace says from now on counts;
        a damaged chunk that the journal's damage made unreachable is no longer expected."""
        self._start = os.path.getsize(self.trace_file)
        still = _reachable(self._prompts, live_slots(self.rank_dir))
        self.damaged = {k: still[k] for k in self.damaged if k in still}

    def ask(self, load: Load) -> list[Outcome]:
        """One request per damaged chunk's prompt, one at a time (two at once could find a
        shared chunk being read by the other, and stop short of their own)."""
        return load.ask(sorted(set(self.damaged.values())), concurrency=1)

    def report(self) -> dict[str, int]:
        """What the trace shows since the restart."""
        lines = trace_lines(self.trace_file, self._start)
        failed = [{c["key"] for c in ln["chunks"] if c["from"] == "failed"} for ln in lines]
        caught = set().union(*failed) & set(self.damaged)
        return {
            "reread_prompts": len(set(self.damaged.values())),
            "damaged_reachable": len(self.damaged),
            "damaged_caught": len(caught),
            "damaged_unread": len(self.damaged) - len(caught),
            "recomputed_requests": sum(1 for f in failed if f),
        }


def _reachable(prompts: dict[int, list[str]], live: dict[str, int]) -> dict[str, int]:
    """Chunk key -> a prompt whose chunks up to it are all in ``live`` (a lookup for that
    prompt reaches the chunk)."""
    out: dict[str, int] = {}
    for prompt, keys in sorted(prompts.items()):
        for key in keys:
            if key not in live:
                break
            out.setdefault(key, prompt)
    return out
