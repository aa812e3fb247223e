"""SlotGuard's contract beyond the basic scenarios: each overwrite runs exactly once, as soon
as its own slots' readers are done, and never for readers that were done already."""

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


def done(f: Future[JobResult], ok: bool = True) -> None:
    f.set_result(JobResult(JobId(0), None, JobKind.DEMOTE, ok=ok))


def test_an_overwrite_of_no_slots_runs_at_once() -> None:
    guard, ran = SlotGuard(), []
    guard.hold([S1], reader())
    guard.after(set(), lambda: ran.append("store"))
    assert ran == ["store"]


def test_a_reader_done_before_it_was_held_holds_nothing_up() -> None:
    guard, ran = SlotGuard(), []
    finished = reader()
    done(finished)
    guard.hold([S1], finished)
    guard.after({S1}, lambda: ran.append("store"))
    assert ran == ["store"]


def test_a_reader_of_several_of_the_slots_releases_the_overwrite_once() -> None:
    guard, ran = SlotGuard(), []
    put = reader()
    guard.hold([S1, S2, S3], put)
    guard.after({S1, S2, S3}, lambda: ran.append("store"))
    assert ran == []
    done(put)
    assert ran == ["store"]


def test_a_failed_reader_frees_its_slots_like_a_good_one() -> None:
    guard, ran = SlotGuard(), []
    demote = reader()
    guard.hold([S1], demote)
    guard.after({S1}, lambda: ran.append("store"))
    done(demote, ok=False)  # the write-back failed: the slot is no longer read all the same
    assert ran == ["store"]


def test_each_overwrite_waits_only_for_the_readers_of_its_own_slots() -> None:
    guard, ran = SlotGuard(), []
    demote1, demote2 = reader(), reader()
    guard.hold([S1], demote1)
    guard.hold([S2], demote2)
    guard.after({S1}, lambda: ran.append("into S1"))
    guard.after({S2}, lambda: ran.append("into S2"))
    done(demote2)
    assert ran == ["into S2"]
    done(demote1)
    assert ran == ["into S2", "into S1"]


def test_readers_finishing_together_on_many_threads_run_the_overwrite_exactly_once() -> None:
    guard, ran = SlotGuard(), []
    readers = [reader() for _ in range(16)]
    for i, r in enumerate(readers):
        guard.hold([S1] if i % 2 else [S1, S2], r)
    guard.after({S1, S2}, lambda: ran.append(threading.current_thread().name))
    start = threading.Barrier(len(readers))

    def finish(r: Future[JobResult]) -> None:
        start.wait()
        done(r)

    threads = [
        threading.Thread(target=finish, args=(r,), name=f"t{i}") for i, r in enumerate(readers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ran) == 1 and ran[0] in {t.name for t in threads}


def test_prune_keeps_a_slot_guarded_while_its_reader_runs() -> None:
    guard, ran = SlotGuard(), []
    finished, running = reader(), reader()
    guard.hold([S1], finished)
    guard.hold([S1], running)
    done(finished)
    guard.prune()  # the step's housekeeping forgets only what is done
    guard.after({S1}, lambda: ran.append("store"))
    assert ran == []
    done(running)
    assert ran == ["store"]


def test_holding_a_new_reader_keeps_the_slots_earlier_readers() -> None:
    guard, ran = SlotGuard(), []
    demote, put = reader(), reader()
    guard.hold([S1], demote)
    guard.hold([S1], put)
    guard.after({S1}, lambda: ran.append("store"))
    done(put)
    assert ran == []  # the demote that was held first still reads S1
    done(demote)
    assert ran == ["store"]


def test_wait_all_returns_at_once_when_every_reader_is_done() -> None:
    guard = SlotGuard()
    guard.wait_all()  # nothing held
    r = reader()
    guard.hold([S1, S2], r)
    done(r)
    guard.wait_all()
    assert r.done()


def test_wait_all_returns_once_readers_finished_on_other_threads() -> None:
    guard = SlotGuard()
    readers = [reader() for _ in range(3)]
    for slot, r in zip((S1, S2, S3), readers, strict=True):
        guard.hold([slot], r)
    finishers = [threading.Thread(target=done, args=(r,)) for r in readers]
    for t in finishers:
        t.start()
    guard.wait_all()  # blocks until every reader is done (no timeout: never hangs here)
    assert all(r.done() for r in readers)
    for t in finishers:
        t.join()


def test_busy_says_whether_an_overwrite_of_the_slots_would_wait() -> None:
    guard, first, second = SlotGuard(), reader(), reader()
    guard.hold([S1], first)
    guard.hold([S1, S2], second)
    assert guard.busy([S1]) and guard.busy([S2, S3]) and not guard.busy([S3])
    assert not guard.busy([])
    done(second)
    assert guard.busy([S1]) and not guard.busy([S2])  # S1's first reader still runs
    done(first, ok=False)
    assert not guard.busy([S1, S2, S3])
