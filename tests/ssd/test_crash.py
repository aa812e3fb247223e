"""kill -9 a writing process at several moments; a reopen must find every acknowledged chunk.

The writer (:mod:`tests.ssd.crash_writer`) overwrites random slots all the
time, so this also checks the DEL-before-overwrite order: a recovered key that
read back someone else's (or torn) bytes would fail its checksum here.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from miniflex.types import ChunkKey, SlotId
from tests.ssd.conftest import aligned, uring_unavailable_reason
from tests.ssd.crash_writer import SLOT, chunk, open_store

REPO = Path(__file__).resolve().parents[2]
DELAYS_S = (0.05, 0.4, 1.0)


def run_and_kill(root: Path, backend: str, first_key: int, delay: float, log: Path) -> None:
    """Start a writer, wait for its first acknowledged chunk plus ``delay``, SIGKILL it."""
    args = [sys.executable, "-m", "tests.ssd.crash_writer", str(root), backend, str(first_key)]
    proc = subprocess.Popen([*args, str(log)], cwd=REPO, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while not (log.exists() and "A " in log.read_text()):
            if proc.poll() is not None or time.monotonic() > deadline:
                _, err = proc.communicate(timeout=5)
                pytest.fail(f"crash writer never acknowledged a chunk: {err.decode()[-2000:]}")
            time.sleep(0.01)
        time.sleep(delay)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)


def expected_after(
    before: dict[int, int], log: str
) -> tuple[dict[int, int], dict[int, set[int | None]]]:
    """(slot -> key that must be there, slot -> keys that may be there) after the writer's log."""
    at_slot = {s: k for k, s in before.items()}
    acked = {int(line.split()[1]) for line in log.splitlines() if line.startswith("A ")}
    unsure: dict[int, set[int | None]] = {}
    for line in log.splitlines():
        if not line.startswith("T "):
            continue
        key, slot = (int(x) for x in line.split()[1:3])
        if key in acked:
            at_slot[slot] = key
            unsure.pop(slot, None)
        else:  # in flight at the kill: old key, nothing or the new key
            unsure[slot] = {at_slot.pop(slot, None), None, key} | unsure.get(slot, set())
    return at_slot, unsure


@pytest.mark.parametrize("backend", ["io_uring", "threads"])
def test_acknowledged_chunks_survive_sigkill(direct_dir: Path, backend: str) -> None:
    if backend == "io_uring" and uring_unavailable_reason():
        pytest.skip(uring_unavailable_reason() or "")
    state: dict[int, int] = {}
    for i, delay in enumerate(DELAYS_S):
        log = direct_dir / f"writer{i}.log"
        run_and_kill(direct_dir, backend, (i + 1) * 10**9, delay, log)
        must, may = expected_after(state, log.read_text())
        with open_store(direct_dir, backend) as store:
            found = {s: k for k, s in store.recovered().items()}
            assert {s: k for s, k in found.items() if s not in may} == must
            for slot, options in may.items():
                assert found.get(slot) in options
            keys = sorted(store.recovered().items())
            bufs = [aligned(SLOT) for _ in keys]
            items = [
                (ChunkKey(k), SlotId(s), memoryview(b))
                for (k, s), b in zip(keys, bufs, strict=True)
            ]
            assert store.read(items)[0] == [True] * len(keys)
            for (k, _), buf in zip(keys, bufs, strict=True):
                assert np.array_equal(buf, chunk(k)), f"chunk {k} read back wrong bytes"
            state = store.recovered()
        assert len(must) > 0
