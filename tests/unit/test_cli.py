"""The ``miniflex`` command line: bad arguments end in argparse's usage error, not a traceback."""

from __future__ import annotations

import pytest

from miniflex.tools.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--synthetic", "--prompts", "0"], "argument --prompts: expected an integer >= 1"),
        (["demo", "--synthetic", "--cpu-slots", "0"], "argument --cpu-slots: expected an integer"),
        (["demo", "--synthetic", "--chunks", "x"], "argument --chunks: expected an integer >= 1"),
        (["demo", "--prompt-tokens", "100"], "expected an integer from 256 to 16384, got '100'"),
        (["tune", "--model", "m", "--repeat", "-1"], "argument --repeat: expected an integer"),
        (["bench", "soak", "--soak-requests", "-5"], "--soak-requests: expected an integer >= 1"),
        (["bench", "soak", "--soak-requests", "0"], "--soak-requests: expected an integer >= 1"),
        (["bench", "soak", "--soak-abort-fraction", "1.5"], "expected a number from 0 to 1"),
        (["bench", "soak", "--soak-abort-fraction", "nan"], "expected a finite number"),
        (["bench", "soak", "--soak-prompt-tokens", "768,256"], "MIN,MAX with MIN <= MAX"),
        (["bench", "soak", "--soak-corrupt-chunks", "-1"], "expected an integer >= 0"),
        (["bench", "ttft", "--ttft-prompts", "1024,-8"], "--ttft-prompts: expected an integer"),
        (["bench", "ttft", "--gpu-blocks", "0"], "--gpu-blocks: expected an integer >= 1"),
        (["bench", "overflow", "--overflow-ratios", "0.5,0"], "expected a number > 0"),
        (["bench", "mixed", "--mixed-long-fraction", "-0.1"], "expected a number from 0 to 1"),
        (["bench", "burst", "--burst-rate", "-1"], "--burst-rate: expected a number >= 0"),
        (["bench", "ttft", "--gpu-memory-utilization", "2"], "expected a number from 0 to 1"),
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
