"""Sleep mode (vLLM 0.33+ lets connectors follow it): before vLLM unmaps the KV cache, every
copy MiniFlex has in flight must be done, since none may touch that memory afterwards."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.connector.engine_config import tokens
from tests.connector.harness import BLOCK, make_harness

CHUNK = 2 * BLOCK


def test_unregistering_the_kv_cache_waits_for_copies_in_flight(tmp_path: Path) -> None:
    h = make_harness(tmp_path / "model")
    prompt = tokens(1, 4 * CHUNK + 5)
    h.mover.gate.clear()  # the prompt's stores will hang mid-flight
    h.add("a", prompt)
    h.step(wait_transfers=False)
    assert h.worker.handler.in_flight("a")

    sleeping = threading.Thread(target=h.worker.unregister_kv_caches)
    sleeping.start()
    sleeping.join(timeout=0.3)
    assert sleeping.is_alive()  # still waiting for the copies that read vLLM's blocks
    h.mover.gate.set()
    sleeping.join(timeout=10)
    assert not sleeping.is_alive() and not h.worker.handler.in_flight("a")

    # awake again (vLLM maps the KV cache back at the same addresses): hits load as before
    h.run()
    assert h.sched.reset_prefix_cache()
    b = h.add("b", prompt)
    h.step()  # the load runs; b is not computed yet
    assert h.loaded_blocks_match(b, 4 * CHUNK // BLOCK)
    h.run()
