"""Fixtures shared by every test folder."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from miniflex.ssd.files import supports_direct


def pytest_report_header() -> str:
    """Which vLLM the run imports, and from where (the version matrix checks this line)."""
    try:
        import vllm
    except ImportError:
        return "vllm: not installed"
    return f"vllm {vllm.__version__} from {Path(vllm.__file__).parent}"


@contextlib.contextmanager
def o_direct_dir(preferred: Path) -> Iterator[Path]:
    """``preferred`` if its file system accepts O_DIRECT, else a fresh dir in /var/tmp."""
    if supports_direct(preferred):
        yield preferred
        return
    fallback = Path(tempfile.mkdtemp(prefix="miniflex-ssd-", dir="/var/tmp"))
    try:
        if not supports_direct(fallback):
            pytest.skip(f"neither {preferred} nor /var/tmp supports O_DIRECT")
        yield fallback
    finally:
        shutil.rmtree(fallback, ignore_errors=True)


@pytest.fixture
def direct_dir(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory whose file system accepts O_DIRECT (tmp_path, else /var/tmp)."""
    with o_direct_dir(tmp_path) as path:
        yield path


MountFS = Callable[..., Path]


@pytest.fixture
def mount_fs(tmp_path: Path) -> Iterator[MountFS]:
    """``mount_fs(mib, kind="ext4", read_only=False)``: a fresh file system, mounted.

    ext4 is a loop-mounted image of ``mib`` MiB; ``ramfs`` (no O_DIRECT) takes
    no size. Root only: skipped, with the reason, where mounting is not allowed.
    Everything mounted is unmounted at the end of the test.
    """
    mounted: list[Path] = []

    def run(*cmd: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(cmd, capture_output=True, check=False)

    def mount(mib: int = 8, kind: str = "ext4", read_only: bool = False) -> Path:
        if os.geteuid() != 0 or not shutil.which("mount"):
            pytest.skip("needs root to mount a file system")
        mnt = tmp_path / f"mnt{len(mounted)}"
        mnt.mkdir()
        opts = ["-o", "ro"] if read_only else []
        if kind == "ext4":
            image = tmp_path / f"fs{len(mounted)}.img"
            image.write_bytes(b"")
            os.truncate(image, mib << 20)
            if not shutil.which("mkfs.ext4") or run("mkfs.ext4", "-q", "-F", str(image)).returncode:
                pytest.skip("cannot make an ext4 image here (mkfs.ext4)")
            done = run("mount", "-o", "loop" + (",ro" if read_only else ""), str(image), str(mnt))
        else:
            done = run("mount", "-t", kind, *opts, kind, str(mnt))
        if done.returncode:
            pytest.skip(f"cannot mount {kind} here: {done.stderr.decode().strip()}")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in reversed(mounted):
        subprocess.run(["umount", str(mnt)], capture_output=True, check=False)
