"""The ``miniflex`` command line: bad arguments end in argparse's usage error, not a traceback."""

from __future__ import annotations

import pytest

from miniflex.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--synthetic", "--prompts", "0"], "argument --prompts: expected an integer >= 1"),
        (["demo", "--synthetic", "--cpu-slots", "0"], "argument --cpu-slots: expected an integer"),
        (["demo", "--synthetic", "--chunks", "x"], "argument --chunks: expected an integer >= 1"),
        (["demo", "--prompt-tokens", "100"], "expected an integer from 256 to 16384, got '100'"),
        (["tune", "--model", "m", "--repeat", "-1"], "argument --repeat: expected an integer"),
    ],
)
def test_bad_numbers_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_smallest_synthetic_demo_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--synthetic", "--prompts", "1", "--chunks", "1", "--cpu-slots", "1"]) == 0
    assert "over-capacity x2" in capsys.readouterr().out
