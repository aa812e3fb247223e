"""SlotGuard: a job that overwrites a CPU slot waits for the slot's background readers only."""

from __future__ import annotations

import threading
from concurrent.futures import Future

from miniflex.plan import JobId, JobKind, JobResult
from miniflex.types import SlotId
from miniflex.worker.slot_guard import SlotGuard

S1, S2, S3 = SlotId(1), SlotId(2), SlotId(3)


def reader() -> Future[JobResult]:
    f: Future[JobResult] = Future()
    f.set_running_or_notify_cancel()
    return f


def done(f: Future[JobResult]) -> None:
    f.set_result(JobResult(JobId(0), None, JobKind.DEMOTE, ok=True))


def test_a_slot_nobody_reads_is_overwritten_at_once_on_the_callers_thread() -> None:
    guard, ran = SlotGuard(), []
    guard.hold([S2], reader())  # another slot's reader does not matter
    guard.after({S1}, lambda: ran.append(threading.current_thread()))
    assert ran == [threading.current_thread()]


def test_the_overwrite_waits_for_every_reader_of_its_slots_and_runs_once() -> None:
    guard, ran = SlotGuard(), []
    demote, put = reader(), reader()
    guard.hold([S1, S2], demote)
    guard.hold([S1], put)  # a second reader of the same slot is kept too
    guard.after({S1, S3}, lambda: ran.append("store"))
    done(put)
    assert ran == []  # the first reader still reads S1
    done(demote)  # the last reader's completion runs it
    assert ran == ["store"]


def test_the_overwrite_runs_on_the_thread_that_finishes_the_last_reader() -> None:
    guard, ran = SlotGuard(), []
    demote = reader()
    guard.hold([S1], demote)
    guard.after({S1}, lambda: ran.append(threading.current_thread().name))
    t = threading.Thread(target=done, args=(demote,), name="disk")
    t.start()
    t.join()
    assert ran == ["disk"]


def test_readers_registered_after_a_queued_overwrite_never_hold_it_up() -> None:
    guard, ran = SlotGuard(), []
    first = reader()
    guard.hold([S1], first)
    guard.after({S1}, lambda: ran.append("store"))
    later = reader()
    guard.hold([S1], later)  # reads what the store will write
    done(first)
    assert ran == ["store"]
    guard.after({S1}, lambda: ran.append("fetch"))  # this one waits for the later reader
    assert ran == ["store"]
    done(later)
    assert ran == ["store", "fetch"]


def test_prune_forgets_finished_readers_and_wait_all_waits_for_the_rest() -> None:
    guard = SlotGuard()
    finished, running = reader(), reader()
    guard.hold([S1], finished)
    guard.hold([S2], running)
    done(finished)
    guard.prune()
    assert guard._readers == {S2: [running]}
    waiter = threading.Thread(target=guard.wait_all)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # still blocked on the running reader
    done(running)
    waiter.join(5)
    assert not waiter.is_alive()
