"""KV kept across restarts and shared through a store is served only to the same model.

Engine A computes a prompt and writes its chunks through to an SSD tier and a
redis-server. Engine B starts over the same directory and the same store with
one change to the model's config.json that leaves every shape alone
(``rope_theta``: RoPE is applied to K before it is cached, so every K differs):
it must serve nothing of A's and compute what the recompute path computes.
Engine C, the model as A ran it, is served from the store again, with A's output.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from miniflex.remote.local_server import LocalServer
from tests.e2e.conftest import NEEDS_REDIS
from tests.e2e.engine import close, expected_hit, make_llm, prompt, run, same_output

pytest.importorskip("redis", reason="the redis client is missing: pip install -e '.[remote]'")
pytestmark = [pytest.mark.e2e, *NEEDS_REDIS]

PROMPT_TOKENS = 1000
KV_TOKENS = 3 * 1024


def set_rope_theta(model: Path, theta: float) -> None:
    config = json.loads((model / "config.json").read_text())
    config["rope_theta"] = theta
    (model / "config.json").write_text(json.dumps(config))


def test_a_changed_model_config_is_never_served_the_old_kv(
    tiny_model: Path, ssd_dir: Path, redis_server: LocalServer, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)  # edited below; the shared one stays as it is
    theta = json.loads((model / "config.json").read_text())["rope_theta"]
    config = {
        "cpu_bytes": "8MiB",
        "ssd_dirs": str(ssd_dir),
        "ssd_bytes": "64MiB",
        "ssd_write": "through",
        "remote_url": redis_server.url,
        "hit_policy": "load",
    }
    tokens = prompt(700, PROMPT_TOKENS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONHASHSEED", "0")  # the same block hashes in every engine
        results = {}
        for name, rope in (("a", theta), ("b", theta * 10), ("c", theta)):
            set_rope_theta(model, rope)
            llm = make_llm(model, KV_TOKENS, config)
            try:
                results[name] = run(llm, tokens)
            finally:
                close(llm)
    a, b, c = results["a"], results["b"], results["c"]
    assert a.miniflex_hit_tokens == 0
    assert b.miniflex_hit_tokens == 0 and b.resident_by_tier == {}, b
    assert not same_output(b, a)  # another RoPE: the same prompt gives another output
    assert c.hit_by_tier.get("remote") == expected_hit(PROMPT_TOKENS), c
    assert same_output(c, a)
