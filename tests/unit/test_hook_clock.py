"""The clocks of ``clocks.py`` and how the counters they feed are reported."""

from __future__ import annotations

import threading
import time

import pytest

from miniflex.clocks import HOOKS, HookTally, ThreadClock, timed_hook
from miniflex.stats import TransferStats


class Side:
    def __init__(self) -> None:
        self.hook_seconds = 0.0

    @timed_hook
    def slow(self, seconds: float) -> str:
        time.sleep(seconds)
        return "done"

    @timed_hook
    def fails(self) -> None:
        time.sleep(0.02)
        raise ValueError("boom")


def test_a_hook_counts_its_wall_time_even_when_it_raises() -> None:
    side = Side()
    assert side.slow(0.05) == "done"
    assert 0.05 <= side.hook_seconds < 1.0
    before = side.hook_seconds
    with pytest.raises(ValueError, match="boom"):
        side.fails()
    assert side.hook_seconds - before >= 0.02


def test_the_tally_names_each_hook_with_its_calls_total_and_longest_call() -> None:
    tally = HookTally()
    for seconds in (0.001, 0.004, 0.002):
        tally.add("wait_for_save", seconds)
    tally.add("get_finished", 0.010)
    tally.add("bind", 0.0001)
    assert tally.summary(top=2) == "get_finished 1/10 ms/10.0 ms, wait_for_save 3/7 ms/4.0 ms"
    assert HookTally().summary() == ""
    Side().slow(0.01)  # timed hooks feed the process-wide tally under their own name
    assert "slow " in HOOKS.summary(top=100)


def test_thread_clock_sums_every_thread_and_takes_each_second_once() -> None:
    clock = ThreadClock()
    threads = [threading.Thread(target=lambda: [clock.add(0.001) for _ in range(1000)])]
    threads.append(threading.Thread(target=lambda: [clock.add(0.002) for _ in range(1000)]))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert abs(clock.take() - 3.0) < 1e-6
    assert clock.take() == 0.0


def test_clocks_alone_are_not_a_report_but_ride_along_with_one() -> None:
    quiet = TransferStats(scheduler_hook_seconds=0.5, thread_cpu_seconds=0.25)
    assert quiet.is_empty()
    busy = TransferStats(stores=1).merge(quiet)
    assert not busy.is_empty()
    counters = busy.as_counters()
    assert counters["scheduler_hook_seconds"] == 0.5 and counters["thread_cpu_seconds"] == 0.25


def test_stats_are_empty_until_a_counter_moves_and_clocks_never_count() -> None:
    from dataclasses import fields

    from miniflex.stats import CLOCKS, TransferStats

    assert TransferStats().is_empty()
    assert TransferStats(**{c: 1.5 for c in CLOCKS}).is_empty()
    for f in fields(TransferStats):
        if f.name in CLOCKS:
            continue
        st = TransferStats()
        value = getattr(st, f.name)
        if isinstance(value, dict):
            value["x"] = 1
        else:
            setattr(st, f.name, 1)
        assert not st.is_empty(), f.name
