"""Run workloads on each engine configuration in turn and write their results.

One engine start per configuration serves every workload of the run (engine
starts dominate the cost: 30-60 s each). Configurations run one at a time and
are shut down before the next starts. A configuration that cannot run here is
skipped with its reason; one that fails is recorded with its error and the
run goes on. Each workload's JSON is rewritten after every configuration, so
a run cut short still leaves what it measured (marked ``"partial": true``).
"""

from __future__ import annotations

import functools
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miniflex.tools.bench.base import Log, Workload
from miniflex.tools.bench.configs import LMCACHE_NOT_RUN
from miniflex.tools.bench.driver import Driver
from miniflex.tools.bench.engines import between_engines
from miniflex.tools.bench.plot import save_plot
from miniflex.tools.bench.report import format_table, write_json

__all__ = ["Candidate", "Outputs", "run_side_by_side"]


@dataclass(frozen=True)
class Candidate:
    """A configuration to compare: how to start its driver, or why it cannot run here."""

    name: str
    start: Callable[[], Driver] | None
    skip: str | None = None


@dataclass(frozen=True)
class Outputs:
    """Where each workload's JSON and PNG go: ``DIR/<workload>/<TAG>.json`` / ``.png`` (TAG
    ``run`` when none is given), e.g. ``bench/results/burst/h200.json``."""

    out_dir: Path
    tag: str = ""
    json_path: Path | None = None  # one workload only: this JSON, the PNG beside it

    def json_for(self, workload: str) -> Path:
        if self.json_path is not None:
            return self.json_path
        return self.out_dir / workload / f"{self.tag or 'run'}.json"

    def png_for(self, workload: str) -> Path:
        return self.json_for(workload).with_suffix(".png")


@dataclass
class _Result:
    rows: list[dict[str, Any]] = field(default_factory=list)
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def run_side_by_side(
    workloads: Sequence[Workload],
    candidates: Sequence[Candidate],
    outputs: Outputs,
    context: dict[str, Any],
    log: Log,
) -> bool:
    """Run everything, print each workload's table, write JSON and PNG; False if any failed.

    An interrupt (Ctrl-C, or ``timeout -s INT``) stops after shutting the
    current engine down; what was measured until then is still printed and
    written, marked partial.
    """
    results = {w.name: _Result() for w in workloads}
    interrupted = False
    for cand in candidates:
        if cand.skip or cand.start is None:
            log(f"{cand.name}: {cand.skip or 'skipped'}")
            for r in results.values():
                r.skipped[cand.name] = cand.skip or "skipped"
            continue
        try:
            _run_candidate(cand, workloads, results, log)
        except KeyboardInterrupt:
            log(f"interrupted during {cand.name}: writing what was measured so far")
            interrupted = True
            break
        finally:
            for w in workloads:
                _write(w, results[w.name], outputs, context, partial=True)
    for w in workloads:
        _finish(w, results[w.name], outputs, context, partial=interrupted)
    return not interrupted and not any(r.failed for r in results.values())


def _finish(
    w: Workload, res: _Result, outputs: Outputs, context: dict[str, Any], partial: bool
) -> None:
    payload = _write(w, res, outputs, context, partial=partial)
    print(f"\n== {w.name}: {w.title}" + (" (partial: interrupted)" if partial else ""))
    print(format_table(res.rows))
    for line in payload["summary"].get("lines", []):
        print(line)
    if payload["engines"]:
        print(f"\n== {w.name}: {_ENGINES}")
        print(format_table(payload["engines"]))
    for name, why in {**res.skipped, **res.failed}.items():
        print(f"{name}: {why.splitlines()[0]}")
    print(f"JSON written to {outputs.json_for(w.name)}")
    if res.rows:
        draw = functools.partial(w.draw, rows=payload["rows"], summary=payload["summary"])
        print(save_plot(outputs.png_for(w.name), draw))


_ENGINES = (
    "configurations on more than one engine (NAME#2): mean over each one's engines, "
    "spread_x = its slowest engine / its fastest, vs_first = against the first "
    "configuration (above 1: better)"
)


def _run_candidate(
    cand: Candidate, workloads: Sequence[Workload], results: dict[str, _Result], log: Log
) -> None:
    assert cand.start is not None
    log(f"starting {cand.name}")
    t0 = time.perf_counter()
    try:
        driver = cand.start()
    except Exception as exc:  # one configuration that cannot start must not end the run
        log(f"{cand.name} failed to start: {exc!r}\n{traceback.format_exc()}")
        for r in results.values():
            r.failed[cand.name] = f"failed to start: {exc!r}"
        return
    log(f"{cand.name} ready after {time.perf_counter() - t0:.0f} s")
    try:
        for w in workloads:
            t1 = time.perf_counter()
            try:
                rows, samples = w.run(driver, log)
            except Exception as exc:  # recorded in the JSON and the exit status, never hidden
                log(f"{cand.name} {w.name} failed: {exc!r}\n{traceback.format_exc()}")
                results[w.name].failed[cand.name] = f"{w.name} failed: {exc!r}"
                continue
            results[w.name].rows += rows
            results[w.name].samples[cand.name] = samples
            log(f"{cand.name} {w.name} done in {time.perf_counter() - t1:.0f} s")
    finally:
        try:
            driver.close()
        except Exception as exc:  # the next configuration still gets its turn
            log(f"{cand.name} did not shut down cleanly: {exc!r}")


def _left_out(res: _Result) -> dict[str, str]:
    """Why LMCache has no row in this workload's results (empty: it has one, or failed)."""
    if "lmcache" in res.failed or any(r.get("config") == "lmcache" for r in res.rows):
        return {}
    return {"lmcache": res.skipped.get("lmcache", LMCACHE_NOT_RUN)}


def _write(
    w: Workload, res: _Result, outputs: Outputs, context: dict[str, Any], partial: bool
) -> dict[str, Any]:
    payload = {
        "workload": w.name,
        "title": w.title,
        "partial": partial,
        "params": w.params(),
        "context": context,
        "rows": res.rows,
        "summary": w.summary(res.rows, context) if res.rows else {"lines": []},
        "skipped": res.skipped,
        "failed": res.failed,
        "left_out": _left_out(res),
        "engines": between_engines(res.rows, w.row_cases, w.row_measures),
        "samples": res.samples,
    }
    write_json(outputs.json_for(w.name), payload)
    return payload
