"""The link to a remote store: down after a failure, fast failures, one probe, back up."""

from __future__ import annotations

from miniflex.remote.link import Link


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_healthy_link_allows_every_call() -> None:
    link = Link("redis://x", retry_s=1.0, clock=Clock())
    assert all(link.allow() for _ in range(3))
    assert link.stats().fast_fails == 0 and not link.stats().down


def test_after_a_failure_calls_fail_fast_until_the_window_ends() -> None:
    clock = Clock()
    link = Link("redis://x", retry_s=1.0, clock=clock)
    link.failed(ConnectionError("refused"), timeout=False)
    assert not link.allow() and not link.allow()
    clock.now += 0.99
    assert not link.allow()
    stats = link.stats()
    assert stats.down and (stats.errors, stats.timeouts, stats.fast_fails) == (1, 0, 3)


def test_one_caller_probes_when_the_window_ends_and_success_brings_the_link_up() -> None:
    clock = Clock()
    link = Link("redis://x", retry_s=1.0, clock=clock)
    link.failed(TimeoutError("slow"), timeout=True)
    clock.now += 1.0
    assert link.allow()  # the probe
    assert not link.allow()  # everyone else, while the probe runs
    link.succeeded()
    assert link.allow() and link.allow()
    stats = link.stats()
    assert not stats.down and (stats.reconnects, stats.timeouts, stats.fast_fails) == (1, 1, 1)


def test_a_failed_probe_opens_a_new_window() -> None:
    clock = Clock()
    link = Link("redis://x", retry_s=1.0, clock=clock)
    link.failed(ConnectionError("refused"), timeout=False)
    clock.now += 1.0
    assert link.allow()
    link.failed(ConnectionError("refused"), timeout=False)
    clock.now += 0.5
    assert not link.allow()
    assert link.stats().errors == 2 and link.stats().reconnects == 0


def test_an_error_reply_is_counted_but_does_not_take_the_link_down() -> None:
    link = Link("redis://x", retry_s=1.0, clock=Clock())
    link.refused(RuntimeError("OOM"), "put")
    link.refused(RuntimeError("OOM"), "put")
    assert link.allow() and link.stats().errors == 2 and not link.stats().down
