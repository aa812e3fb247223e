"""bench.fresh_copy smoke: a small run prints its JSON and table, and writes the JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import fresh_copy


def test_a_small_run_writes_every_way_and_its_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fresh.json"
    args = ["--chunk-bytes", "64KiB", "--chunks", "4", "--repeat", "1", "--threads", "3"]
    args += ["--json", str(out)]
    assert fresh_copy.main(args) == 0
    result = json.loads(out.read_text())
    assert set(result["gbps"]) == {f"{w}_gbps" for w in fresh_copy.WAYS}
    assert all(v > 0 for v in result["gbps"].values())
    assert "| 64KiB | 4 |" in (text := capsys.readouterr().out) and "fresh, 3 threads" in text


def test_a_huge_page_buffer_is_fresh_zeroed_memory_of_the_size_asked() -> None:
    buf = fresh_copy.huge_buffer(3 << 20)
    assert buf.size == 3 << 20 and buf.flags.writeable and not buf.any()


def test_bad_sizes_are_refused_before_anything_runs(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (["--chunks", "0"], ["--threads", "0"]):
        with pytest.raises(SystemExit):
            fresh_copy.main(bad)
        assert bad[0] in capsys.readouterr().err
