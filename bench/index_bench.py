"""Benchmark `HashIndex` against the straightforward dict-based index.

Run as ``python -m bench.index_bench [--resident 100000] [--prefix 2000]
[--lookups 10000] [--repeat N] [--json PATH]``.

Both indexes hold the same ``--resident`` random 128-bit keys. Timings are the
best of ``--repeat`` runs (``time.perf_counter_ns``) after a warm-up run, so JIT
compilation is excluded. ``speedup`` is dict time / miniflex time (> 1 means
miniflex is faster).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import random
import sys
import time
from collections.abc import Callable

import numpy as np

from miniflex.index import HashIndex, keys_to_array
from miniflex.tools.bench.report import emit
from miniflex.types import SlotId, Tier


class DictIndex:
    """What a straightforward implementation does: a dict plus Python loops."""

    def __init__(self) -> None:
        self._d: dict[int, tuple[Tier, int]] = {}

    def insert(self, key: int, tier: Tier, slot: int) -> None:
        self._d[key] = (tier, slot)

    def lookup(self, key: int) -> tuple[Tier, int] | None:
        return self._d.get(key)

    def prefix_match(self, keys: list[int]) -> int:
        d = self._d
        for i, k in enumerate(keys):
            if k not in d:
                return i
        return len(keys)

    def lookup_many(self, keys: list[int]) -> list[tuple[Tier, int] | None]:
        d = self._d
        return [d.get(k) for k in keys]


def best_us(fn: Callable[[], object], repeat: int) -> float:
    """Best wall time of ``fn()`` over ``repeat`` runs, in microseconds, after one warm-up."""
    fn()
    best = None
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        fn()
        dt = time.perf_counter_ns() - t0
        best = dt if best is None else min(best, dt)
    assert best is not None
    return best / 1000.0


def progress(msg: str) -> None:
    print(f"[index_bench] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--resident", type=int, default=100_000, help="keys in both indexes")
    p.add_argument("--prefix", type=int, default=2000, help="keys per batch prefix match")
    p.add_argument("--lookups", type=int, default=10_000, help="keys for the single-key loop")
    p.add_argument("--repeat", type=int, default=20, help="timed runs per measurement (best kept)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the JSON result here")
    args = p.parse_args(argv)
    if args.resident < args.prefix or args.prefix < 2 or args.repeat < 1:
        p.error("need --resident >= --prefix >= 2 and --repeat >= 1")
    return args


Case = tuple[str, int, Callable[[], object], Callable[[], object]]
"""(operation, keys per call, the HashIndex run, the DictIndex run)."""


def random_keys(rng: random.Random, n: int) -> tuple[list[int], int]:
    """``n`` distinct random 128-bit keys, and one key that is not among them."""
    resident = list({rng.getrandbits(128) for _ in range(n + 16)})[:n]
    resident_set = set(resident)
    absent = rng.getrandbits(128)
    while absent in resident_set:
        absent = rng.getrandbits(128)
    return resident, absent


def warm_up(resident: list[int]) -> None:
    """JIT-compile (or load from numba's cache) every kernel the timings use."""
    warm = HashIndex(max_entries=64)
    for k in resident[:64]:
        warm.insert(k, Tier.SSD, SlotId(0))
    for k in resident[:32]:
        warm.delete(k)
    warm.lookup(resident[40])
    _ = resident[40] in warm


def build(resident: list[int]) -> tuple[HashIndex, DictIndex, dict]:
    """Both indexes holding ``resident``, and the row timing their builds."""
    mini = HashIndex(max_entries=len(resident))
    ref = DictIndex()
    t0 = time.perf_counter_ns()
    for i, k in enumerate(resident):
        mini.insert(k, Tier.CPU, SlotId(i))
    mini_us = (time.perf_counter_ns() - t0) / 1000
    t0 = time.perf_counter_ns()
    for i, k in enumerate(resident):
        ref.insert(k, Tier.CPU, i)
    dict_us = (time.perf_counter_ns() - t0) / 1000
    n = len(resident)
    return mini, ref, row(f"build: insert {n} keys (Python loop)", n, mini_us, dict_us)


def row(op: str, keys: int, mini_us: float, dict_us: float) -> dict:
    return {
        "op": op,
        "keys": keys,
        "miniflex_us": round(mini_us, 2),
        "dict_us": round(dict_us, 2),
        "speedup": round(dict_us / mini_us, 2),
    }


def make_cases(
    args: argparse.Namespace,
    rng: random.Random,
    mini: HashIndex,
    ref: DictIndex,
    resident: list[int],
    absent: int,
) -> list[Case]:
    """The timed operations, checked first to give the same answers on both indexes."""
    full = rng.sample(resident, args.prefix)
    half = [*full[: args.prefix // 2], absent, *full[args.prefix // 2 + 1 :]]
    full_arr = keys_to_array(full)
    half_arr = keys_to_array(half)
    probe = [rng.choice(resident) if i % 4 else rng.getrandbits(128) for i in range(args.lookups)]

    # Both implementations must agree before their speed means anything.
    assert mini.prefix_match(full_arr) == ref.prefix_match(full) == args.prefix
    assert mini.prefix_match(half_arr) == ref.prefix_match(half) == args.prefix // 2
    assert [mini.lookup(k) for k in probe[:200]] == [ref.lookup(k) for k in probe[:200]]

    def lookup_loop(index: HashIndex | DictIndex) -> Callable[[], object]:
        def run() -> object:
            lookup = index.lookup
            return [lookup(k) for k in probe]

        return run

    return [
        ("lookup, one key per call", args.lookups, lookup_loop(mini), lookup_loop(ref)),
        (
            "prefix_match, all resident",
            args.prefix,
            lambda: mini.prefix_match(full_arr),
            lambda: ref.prefix_match(full),
        ),
        (
            "prefix_match, miss half way",
            args.prefix,
            lambda: mini.prefix_match(half_arr),
            lambda: ref.prefix_match(half),
        ),
        (
            "prefix_match incl. keys_to_array",
            args.prefix,
            lambda: mini.prefix_match(keys_to_array(full)),
            lambda: ref.prefix_match(full),
        ),
        (
            "lookup_many, all resident",
            args.prefix,
            lambda: mini.lookup_many(full_arr),
            lambda: ref.lookup_many(full),
        ),
    ]


def time_cases(cases: list[Case], repeat: int) -> list[dict]:
    rows = []
    for name, nkeys, run_mini, run_dict in cases:
        n = max(1, repeat // 4) if nkeys >= 10_000 else repeat
        progress(f"timing {name} (best of {n})")
        rows.append(row(name, nkeys, best_us(run_mini, n), best_us(run_dict, n)))
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    n = args.resident
    progress(f"generating {n} random 128-bit keys")
    resident, absent = random_keys(rng, n)
    progress("warming up (JIT compile or load the numba cache)")
    warm_up(resident)
    progress("building HashIndex and DictIndex")
    mini, ref, build_row = build(resident)
    cases = make_cases(args, rng, mini, ref, resident, absent)
    rows = [build_row, *time_cases(cases, args.repeat)]
    emit(
        "HashIndex vs dict index",
        rows,
        json_path=args.json,
        extra={
            "resident": n,
            "prefix": args.prefix,
            "repeat": args.repeat,
            "capacity": mini.capacity,
            "python": platform.python_version(),
            "numpy": np.__version__,
            "numba": importlib.metadata.version("numba"),
            "machine": platform.machine(),
        },
    )


if __name__ == "__main__":
    main()
