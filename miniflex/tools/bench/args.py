"""The command line of ``miniflex bench``: every option, with its default.

Defaults are sized for an 8B-class model on one large GPU; ``bench/run_h200.sh``
and the tests pass their own. Importing this module imports nothing heavy.
"""

from __future__ import annotations

import argparse

from miniflex.config.parse import parse_seconds
from miniflex.errors import ConfigError
from miniflex.tools.bench.argtypes import count, count0, counts, fraction, positive, rate
from miniflex.tools.bench.configs import CONFIGS
from miniflex.tools.bench.decode import DEFAULT_CASES, DecodeCase
from miniflex.tools.bench.soak_args import add_soak_arguments

__all__ = ["WORKLOADS", "add_arguments"]

WORKLOADS = ("ttft", "overflow", "mixed", "overhead", "multiturn", "decode", "burst", "soak")


def _cases(text: str) -> tuple[DecodeCase, ...]:
    try:
        return tuple(DecodeCase.parse(x.strip()) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ratios(text: str) -> tuple[float, ...]:
    values = tuple(positive(x.strip()) for x in text.split(",") if x.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"expected one or more numbers > 0, got {text!r}")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add every ``miniflex bench`` option to ``p`` (the ``bench`` subparser)."""
    p.add_argument(
        "workloads",
        help=", ".join(WORKLOADS) + ", or several comma-separated (soak alone: it starts its "
        "own servers)",
    )
    _engines(p.add_argument_group("engines"))
    _tiers(p.add_argument_group("tiers (default: sized from the workloads)"))
    _workloads(p.add_argument_group("workloads"))
    add_soak_arguments(p.add_argument_group("soak (miniflex/tools/bench/soak.py)"))
    o = p.add_argument_group("output")
    o.add_argument("--out-dir", default="bench/results", help="JSON and PNG per workload")
    o.add_argument(
        "--tag", default="", help="file name: <out-dir>/<workload>/<tag>.json (default: run)"
    )
    o.add_argument("--json", help="JSON path (one workload only; the PNG goes beside it)")
    o.add_argument(
        "--dry-run", action="store_true", help="check the arguments, print the engine settings"
    )
    o.add_argument(
        "--commit", help="the commit measured, recorded in the JSON (default: git's HEAD here)"
    )


def _engines(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--configs",
        default="apc,native,miniflex-cpu,miniflex-ssd",
        help="offline: side by side, one at a time: "
        + ", ".join(CONFIGS)
        + "; MiniFlex ones take settings after '+' (miniflex-cpu+store=false); NAME#2 starts "
        "another engine of NAME, and each workload then also prints every configuration's "
        "mean and spread over its engines",
    )
    g.add_argument(
        "--url",
        action="append",
        default=[],
        metavar="[NAME=]URL",
        help="drive running OpenAI-compatible servers instead (repeatable)",
    )
    g.add_argument(
        "--model",
        help="model directory (offline: required; with --url: for the vocabulary and KV size)",
    )
    g.add_argument("--load-format", default="auto", help="'dummy' for random weights")
    g.add_argument(
        "--block-size", type=count, default=16, help="vLLM block size (CPU backend: multiple of 32)"
    )
    g.add_argument(
        "--gpu-blocks", type=count, help="vLLM KV capacity in blocks (offline: required)"
    )
    g.add_argument("--max-model-len", type=count, help="default: the longest prompt + 64")
    g.add_argument("--max-num-seqs", type=count, default=16)
    g.add_argument("--max-num-batched-tokens", type=count, default=8192)
    g.add_argument("--gpu-memory-utilization", type=fraction, default=0.9)
    g.add_argument(
        "--tensor-parallel-size",
        type=count,
        default=1,
        help="TP ranks per engine (--gpu-blocks and every tier size are per engine)",
    )
    g.add_argument(
        "--eager",
        action="store_true",
        help="enforce_eager: no torch.compile, no CUDA graphs (default: vLLM's defaults, as "
        "users run it)",
    )


def _tiers(t: argparse._ArgumentGroup) -> None:
    t.add_argument(
        "--cpu-bytes", help="MiniFlex CPU tier = the native connector's cpu_bytes_to_use"
    )
    t.add_argument(
        "--ssd-cpu-bytes",
        help="miniflex-ssd: CPU tier in front of the SSD tier (default: a quarter of the "
        "working set, so that the SSD tier is read; cpu: the CPU tier's size, for CPU+SSD "
        "against the CPU tier alone)",
    )
    t.add_argument("--ssd-bytes", help="miniflex-ssd: SSD tier size")
    t.add_argument(
        "--ssd-dir",
        help="miniflex-ssd: a fresh directory is made (and removed) in it; default /var/tmp",
    )
    t.add_argument(
        "--blocks-per-chunk", type=count, help="MiniFlex chunk in blocks (default: auto)"
    )


def _settle_seconds(text: str) -> float:
    try:
        return parse_seconds("--ttft-settle", text, 0.0, 3600.0)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _workloads(w: argparse._ArgumentGroup) -> None:
    """Every workload's options, workload by workload, then the prompts' seed and vocabulary."""
    _ttft_options(w)
    _overflow_options(w)
    _mixed_options(w)
    _overhead_options(w)
    _multiturn_options(w)
    _decode_options(w)
    _burst_options(w)
    w.add_argument("--seed", type=int, default=0, help="prompt seed (change it to reuse a server)")
    w.add_argument("--vocab-size", type=count, default=32000, help="with --url and no --model")


def _ttft_options(w: argparse._ArgumentGroup) -> None:
    """The ttft workload's options."""
    w.add_argument(
        "--ttft-prompts", type=counts, default=(1024, 8192, 30000), help="prompt lengths"
    )
    w.add_argument(
        "--repeat", type=count, default=1, help="ttft: fresh prompts per length (median)"
    )
    w.add_argument(
        "--ttft-evict",
        choices=("gpu", "cpu"),
        default="gpu",
        help="ttft: evict vLLM's copy only (gpu), or also push the prompt out of a CPU tier of "
        "--ssd-cpu-bytes with unique fillers worth 1.5x it (cpu: SSD-resident prompts)",
    )
    w.add_argument(
        "--ttft-settle",
        type=_settle_seconds,
        default=0.0,
        help="ttft: seconds to wait after the eviction, before the evicted prompt is sent, so "
        "that the disk has written what the fillers left and the load is timed alone "
        "(default 0: at once, as a server meets it)",
    )


def _overflow_options(w: argparse._ArgumentGroup) -> None:
    """The overflow workload's options."""
    w.add_argument("--overflow-prompt-tokens", type=count, default=4096)
    w.add_argument(
        "--overflow-ratios",
        type=_ratios,
        default=(0.5, 1.0, 1.5, 2.0, 3.0),
        help="working set / vLLM KV capacity",
    )
    w.add_argument(
        "--overflow-passes", type=count, default=2, help="the first only fills the caches"
    )


def _mixed_options(w: argparse._ArgumentGroup) -> None:
    """The mixed workload's options."""
    w.add_argument("--mixed-prefixes", type=count, default=4)
    w.add_argument("--mixed-prefix-tokens", type=count, default=8192)
    w.add_argument("--mixed-suffix-tokens", type=count, default=128)
    w.add_argument("--mixed-short-tokens", type=count, default=256)
    w.add_argument("--mixed-long-fraction", type=fraction, default=0.5)
    w.add_argument("--mixed-rate", type=positive, default=4.0, help="requests per second (Poisson)")
    w.add_argument("--mixed-requests", type=count, default=80)
    w.add_argument("--mixed-max-tokens", type=count, default=8)


def _overhead_options(w: argparse._ArgumentGroup) -> None:
    """The overhead workload's options."""
    w.add_argument("--overhead-prompts", type=count, default=32, help="batch of unique prompts")
    w.add_argument("--overhead-prompt-tokens", type=count, default=2048)
    w.add_argument("--overhead-max-tokens", type=count, default=16)
    w.add_argument("--overhead-serial", type=count0, default=8, help="unique prompts one at a time")
    w.add_argument(
        "--overhead-rounds", type=count, default=2, help="batch rounds (median compared)"
    )


def _multiturn_options(w: argparse._ArgumentGroup) -> None:
    """The multiturn workload's options."""
    w.add_argument("--multiturn-prefix-tokens", type=count, default=20000, help="the history")
    w.add_argument("--multiturn-new-tokens", type=count, default=4096, help="the next turn's")
    w.add_argument("--multiturn-repeat", type=count, default=1, help="conversations (median)")


def _decode_options(w: argparse._ArgumentGroup) -> None:
    """The decode workload's options."""
    w.add_argument(
        "--decode-cases",
        type=_cases,
        default=DEFAULT_CASES,
        help="decode: PROMPTSxTOKENSxOUT, comma-separated (default 32x512x256,2x12000x256)",
    )
    w.add_argument("--decode-rounds", type=count, default=3, help="decode: rounds (median)")


def _burst_options(w: argparse._ArgumentGroup) -> None:
    """The burst workload's options."""
    w.add_argument("--burst-prefixes", type=count, default=12)
    w.add_argument("--burst-prefix-tokens", type=count, default=4096)
    w.add_argument("--burst-suffix-tokens", type=count, default=64)
    w.add_argument("--burst-requests", type=count, default=96, help="burst: requests per round")
    w.add_argument("--burst-max-tokens", type=count, default=64)
    w.add_argument("--burst-rounds", type=count, default=3)
    w.add_argument(
        "--burst-rate", type=rate, default=0.0, help="burst: requests/s (0: all at once)"
    )
