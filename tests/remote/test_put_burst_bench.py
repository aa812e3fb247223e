"""``bench/put_burst.py`` runs end to end on a small scale: every copy-thread count stores
the whole burst, with nothing dropped, and the JSON has one row per count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("redis")

from bench import put_burst
from tests.remote.conftest import NEEDS_SERVER

pytestmark = NEEDS_SERVER


def test_put_burst_reports_each_thread_count(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    args = ["--chunk-bytes", "64KiB", "--slots", "16", "--chunks", "48", "--threads", "1,3"]
    assert put_burst.main([*args, "--repeat", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["copy_threads"] for r in rows] == [1, 3]
    assert rows[0]["vs_1_threads"] == 1.0 and all(r["store_gbps"] > 0 for r in rows)


@pytest.mark.parametrize(
    "bad", [["--slots", "8"], ["--chunks", "16"], ["--threads", "0,4"], ["--threads", "x"]]
)
def test_bad_settings_are_refused_before_any_server_starts(
    bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        put_burst.main(bad)
    assert bad[0] in capsys.readouterr().err
