"""A hybrid model's two KV cache groups through a shared remote store (vLLM's real Scheduler).

Engine A computes a prompt and puts each group's chunks under that group's own keys;
engine B, started afresh, finds both groups in the store and loads them, and its next
forward reads every page of both groups bit for bit as A computed them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("redis")

from miniflex.connector import compat
from miniflex.remote.local_server import LocalServer
from tests.connector.engine_config import tokens
from tests.connector.test_groups_flow import CHUNK, Engine, load_and_check
from tests.remote.conftest import NEEDS_SERVER

pytestmark = NEEDS_SERVER
PROMPT = 10 * CHUNK + 5


def engine(tmp_path: Path, url: str) -> Engine:
    if compat.hma_base() is None or compat.transfer_results_class() is None:
        pytest.skip("this vLLM has no SupportsHMA, or cannot be told a group's load failed")
    return Engine(tmp_path, 4 * CHUNK, remote_url=url, remote_timeout_s=0.5)


def test_a_second_engine_loads_both_groups_from_the_store(
    tmp_path: Path, server: LocalServer
) -> None:
    first = engine(tmp_path, server.url)
    a = first.add("a", tokens(1, PROMPT))
    first.run()
    first.worker.shutdown()  # puts what its write-through queued
    second = engine(tmp_path, server.url)
    load_and_check(second, a, "b", 10 * CHUNK)  # both groups' pages, bit for bit
    assert second.params["b"]["hit_tokens_remote"] == 10 * CHUNK
    second.worker.shutdown()


def test_a_prompt_with_nothing_to_load_asks_no_group_about_windows(
    tmp_path: Path, server: LocalServer
) -> None:
    first = engine(tmp_path, server.url)
    asked: list[int] = []
    for part in first.sched.connector.parts:
        lookup = part.manager.remote
        real = lookup.held_each
        lookup.held_each = lambda keys, real=real: asked.append(len(keys)) or real(keys)
    first.add("a", tokens(1, PROMPT))
    first.run()  # nothing stored anywhere yet: the main group decides no load
    assert asked == []
    first.worker.shutdown()
