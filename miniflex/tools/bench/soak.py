"""``miniflex bench soak``: a MiniFlex server under load, with faults, against plain vLLM.

The plain server (first configuration) answers every prompt of the pool once,
one at a time: the reference. The MiniFlex server then takes ``requests``
requests in ``rounds`` rounds, ``concurrency`` at a time, a share of whose
clients hang up mid-stream; its KV cache is far below the batch, so vLLM
preempts. Round 1 warms the tiers; each later round injects the next fault of
``faults``:

* ``disk_full``: the SSD tier's file system is filled to ENOSPC for the round
  (its data slots are preallocated, so the journal's appends fail), then freed;
* ``kill_corrupt``: after a share of the round, ``kill -9`` of the whole
  server with requests in flight; bytes of chunks on SSD and of journal
  records are damaged; the server restarts on the same SSD directory and the
  round goes on;
* ``none``: a round without a fault.

After every round, with every client answered: the server runs (no crash),
each completed output equals the reference's, MiniFlex holds nothing pinned or
moving and no job or request (``/metrics`` and the status file, with the time
it took them to show it), and the server's memory (PSS) is recorded, so its
growth across rounds shows. Rows are one per round; the CI test
(``tests/e2e/test_soak.py``) runs a small version and asserts on them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from miniflex.tools.bench.base import Log, Workload
from miniflex.tools.bench.driver import Driver
from miniflex.tools.bench.faults import corrupt_chunks, corrupt_journal
from miniflex.tools.bench.soak_checks import counters, wait_idle
from miniflex.tools.bench.soak_load import Load, Outcome, PromptPool, Tally, mismatches
from miniflex.tools.bench.soak_server import ServerDriver

__all__ = ["FAULTS", "SoakWorkload"]

FAULTS = ("none", "disk_full", "kill_corrupt")
KILL_AFTER = 0.4  # share of a kill_corrupt round sent before the kill
MIB = 1 << 20


@dataclass
class SoakWorkload(Workload):
    name: ClassVar[str] = "soak"
    title: ClassVar[str] = "Soak: concurrent load with aborts, preemption, a full disk, kill -9"

    pool: PromptPool
    requests: int = 10_000
    rounds: int = 10
    concurrency: int = 8
    abort_fraction: float = 0.2
    max_tokens: int = 8
    faults: tuple[str, ...] = ("disk_full", "kill_corrupt", "none")
    corrupt_chunks: int = 8
    corrupt_records: int = 4
    seed: int = 0
    reference: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def max_prompt_tokens(self) -> int:
        return max(len(p) for p in self.pool.prompts)

    def working_set_tokens(self, capacity_tokens: int) -> int:
        return self.pool.tokens()

    def params(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k not in ("pool", "reference")}
        out["prompts"] = len(self.pool)
        out["pool_tokens"] = self.pool.tokens()
        return out

    def round_fault(self, index: int) -> str:
        """Round 1 warms up; each later round takes the next of ``faults``, cyclically."""
        if index == 0 or not self.faults:
            return "none"
        return self.faults[(index - 1) % len(self.faults)]

    def run(self, driver: Driver, log: Log) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        assert isinstance(driver, ServerDriver), "the soak starts its own servers"
        load = Load(driver.url, driver.model, self.pool, self.max_tokens)
        if not driver.miniflex:
            t0 = time.perf_counter()
            self.reference = load.reference()
            log(f"{driver.name}: reference outputs of {len(self.reference)} prompts")
            row = {"config": driver.name, "round": 0, "fault": "reference"}
            return [{**row, "requests": len(self.reference), "seconds": _since(t0)}], []
        rows = []
        for i in range(self.rounds):
            n = self.requests // self.rounds + (i < self.requests % self.rounds)
            rows.append(self._round(driver, load, i, n, log))
            log(f"{driver.name} round {i + 1}/{self.rounds}: {_brief(rows[-1])}")
        return rows, []

    def _round(
        self, driver: ServerDriver, load: Load, index: int, n: int, log: Log
    ) -> dict[str, Any]:
        fault, srv = self.round_fault(index), driver.server
        t0, starts, before = time.perf_counter(), srv.starts, counters(srv)
        seen: dict[str, float] = {}
        row: dict[str, Any] = {"config": driver.name, "round": index + 1, "fault": fault}
        seed = self.seed * 1000 + index
        if fault == "disk_full" and driver.disk.path is not None:
            row["disk_filled_mib"] = round(driver.disk.fill() / MIB, 1)
            row["disk_filled"] = 1
            try:
                done = load.run(n, self.concurrency, self.abort_fraction, seed)
            finally:
                driver.disk.release()
        elif fault == "kill_corrupt":
            done, at_kill = self._kill_corrupt(driver, load, n, seed, row, log)
            seen = {k: v - before.get(k, 0) for k, v in at_kill.items()}  # the old process's
        else:
            if fault == "disk_full":
                row["skipped"] = driver.disk.reason
            done = load.run(n, self.concurrency, self.abort_fraction, seed)
        idle = wait_idle(srv, driver.status_file)
        after = counters(srv)
        row.update(self._outcomes(done, row.get("cut_by_kill", 0)))
        row.update(seconds=_since(t0), alive=srv.alive(), restarts=srv.starts - starts)
        pss = {name: round(b / MIB, 1) for name, b in srv.pss_by_process().items()}
        row.update(idle.row(), liveness=idle.liveness, pss_mib=round(sum(pss.values()), 1))
        row["pss_mib_by_process"] = pss
        base = {} if srv.starts != starts else before
        for key in set(after) | set(seen):
            row[key] = round(after.get(key, 0) - base.get(key, 0) + seen.get(key, 0), 3)
        return row

    def _kill_corrupt(
        self, driver: ServerDriver, load: Load, n: int, seed: int, row: dict[str, Any], log: Log
    ) -> tuple[list[Outcome], dict[str, float]]:
        """Send a share, kill -9 with requests in flight, damage bytes, restart, send the rest."""
        srv, first = driver.server, int(n * KILL_AFTER)
        done = load.run(first, self.concurrency, self.abort_fraction, seed)
        stop, cut, tally = threading.Event(), [], Tally()
        rest = n - first
        sender = threading.Thread(
            target=lambda: cut.extend(load.run(rest, self.concurrency, 0.0, seed + 1, stop, tally))
        )
        before_kill = counters(srv)
        sender.start()
        deadline = time.monotonic() + 60
        while not _kill_now(tally, rest) and time.monotonic() < deadline and sender.is_alive():
            time.sleep(0.005)
        row["in_flight_at_kill"] = tally.in_flight()
        stop.set()  # no request starts after this: those not sent go after the restart
        srv.kill()
        sender.join()
        row["cut_by_kill"] = sum(1 for o in cut if o.error is not None)
        done += [o for o in cut if o.error is None]
        rank_dir = driver.rank_dir
        row["corrupted_chunks"] = len(corrupt_chunks(rank_dir, self.corrupt_chunks, seed))
        row["damaged_journal_records"] = corrupt_journal(rank_dir, self.corrupt_records, seed)
        log_before = len(srv.log_text())
        srv.restart()
        row["restart_s"] = round(srv.wait_ready(), 1)
        tail = srv.log_text()[log_before:]
        row["journal_damage_logged"] = (
            f"skipped {row['damaged_journal_records']} damaged record(s)" in tail
        )
        rest = n - len(done) - row["cut_by_kill"]
        done += load.run(rest, self.concurrency, self.abort_fraction, seed + 2)
        return done, before_kill

    def _outcomes(self, done: list[Outcome], cut: int) -> dict[str, Any]:
        aborted = sum(1 for o in done if o.aborted and o.error is None)
        completed = [o for o in done if o.tokens is not None]
        return {
            "requests": len(done) + cut,
            "completed": len(completed),
            "aborted": aborted,
            "errors": sum(1 for o in done if o.error is not None),
            "mismatches": mismatches(completed, self.reference) if self.reference else None,
        }

    def summary(self, rows: list[dict[str, Any]], context: dict[str, Any]) -> dict[str, Any]:
        mf = [r for r in rows if r["fault"] != "reference"]
        if not mf:
            return {"lines": ["no MiniFlex rounds ran"]}
        total = {k: sum(r.get(k) or 0 for r in mf) for k in _SUMMED}
        secs = sum(r["seconds"] for r in mf)
        pss = [r["pss_mib"] for r in mf]
        lost = total["errors"] + total["mismatches"]
        lines = [
            f"{total['requests']} requests in {len(mf)} rounds, {secs:.0f} s "
            f"({total['requests'] / secs:.1f}/s): {total['completed']} completed, "
            f"{total['aborted']} hung up mid-stream, {total['cut_by_kill']} cut by the kill -9",
            f"lost: {total['mismatches']} outputs differ from plain vLLM's, "
            f"{total['errors']} requests failed otherwise ("
            + ("nothing lost)" if not lost else "NOT nothing lost)"),
            f"faults: {total['disk_filled']} disk-full rounds ({total['ssd_failures_write']:.0f} "
            f"SSD writes failed), {total['restarts']} kill -9 + restart "
            f"({total['corrupted_chunks']} chunks and {total['damaged_journal_records']} journal "
            f"records damaged; {total['ssd_failures_read']:.0f} checksum failures caught), "
            f"{total['num_preemptions']:.0f} preemptions",
            f"idle after every round: {all(r['idle'] for r in mf)} (within "
            f"{max(r['idle_after_s'] for r in mf):.1f} s); server alive after every round: "
            f"{all(r['alive'] for r in mf)}",
            f"memory (PSS, MiB) by round: {', '.join(f'{p:.0f}' for p in pss)}",
            "memory of each server process, first round to last (max): "
            + "; ".join(f"{a:.0f} -> {b:.0f} ({m:.0f})" for a, b, m in _lifetimes(mf)),
        ]
        return {"totals": total, "seconds": secs, "pss_mib": pss, "lost": lost, "lines": lines}

    def draw(self, plt: Any, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
        mf = [r for r in rows if r["fault"] != "reference"]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
        xs = [r["round"] for r in mf]
        ax1.plot(xs, [r["pss_mib"] for r in mf], marker="o")
        ax1.set_ylabel("server memory, PSS MiB")
        ax2.bar(xs, [r["requests"] / r["seconds"] for r in mf])
        ax2.set_ylabel("requests/s")
        for ax in (ax1, ax2):
            ax.set_xlabel("round")
        for r in mf:
            if r["fault"] != "none":
                ax2.annotate(r["fault"], (r["round"], 0), rotation=90, fontsize=7, va="bottom")
        fig.suptitle(self.title, fontsize=10)


_SUMMED = (
    "requests",
    "completed",
    "aborted",
    "cut_by_kill",
    "errors",
    "mismatches",
    "restarts",
    "corrupted_chunks",
    "damaged_journal_records",
    "ssd_failures_read",
    "ssd_failures_write",
    "num_preemptions",
    "disk_filled",
)


def _lifetimes(rows: list[dict[str, Any]]) -> list[tuple[float, float, float]]:
    """PSS of the first and last round, and the most, of each server process (a restart
    starts a new one)."""
    spans: list[list[float]] = []
    for r in rows:
        if r.get("restarts") or not spans:
            spans.append([])
        spans[-1].append(r["pss_mib"])
    return [(p[0], p[-1], max(p)) for p in spans]


def _since(t0: float) -> float:
    return round(time.perf_counter() - t0, 2)


def _brief(row: dict[str, Any]) -> str:
    keys = ("fault", "requests", "completed", "mismatches", "errors", "idle_after_s", "pss_mib")
    return ", ".join(f"{k}={row.get(k)}" for k in keys)


def _kill_now(tally: Tally, rest: int) -> bool:
    """A third of the requests sent before the kill are back, and some are in flight, so the
    kill cuts requests mid-way and two thirds are still to go."""
    return len(tally.done) >= rest // 3 and tally.in_flight() > 0
