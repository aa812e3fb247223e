"""The options of ``miniflex bench soak`` (``soak_driver.py`` says what it runs).

Importing this module imports nothing heavy.
"""

from __future__ import annotations

import argparse

from miniflex.tools.bench.argtypes import count, count0, fraction, min_max

__all__ = ["add_soak_arguments"]


def add_soak_arguments(g: argparse._ArgumentGroup) -> None:
    """The soak's options (``--model``, ``--gpu-blocks``, ``--block-size``, ``--cpu-bytes``,
    ``--ssd-bytes``, ``--seed`` and the output ones are shared with the other workloads)."""
    g.add_argument("--soak-requests", type=count, default=10_000, help="MiniFlex requests, in all")
    g.add_argument("--soak-rounds", type=count, default=10, help="rounds; faults between them")
    g.add_argument("--soak-concurrency", type=count, default=8, help="clients at once")
    g.add_argument("--soak-abort-fraction", type=fraction, default=0.2, help="clients that hang up")
    g.add_argument("--soak-docs", type=count, default=16, help="documents (shared prefixes)")
    g.add_argument("--soak-variants", type=count, default=3, help="prompts per document")
    g.add_argument(
        "--soak-prompt-tokens",
        type=min_max,
        default=(256, 768),
        help="MIN,MAX prompt length",
    )
    g.add_argument("--soak-max-tokens", type=count, default=8, help="output tokens per request")
    g.add_argument(
        "--soak-faults",
        type=lambda t: tuple(x.strip() for x in t.split(",") if x.strip()),
        default=("disk_full", "kill_corrupt", "none"),
        help="faults of rounds 2.. in turn: disk_full, kill_corrupt, none",
    )
    g.add_argument(
        "--soak-corrupt-chunks", type=count0, default=8, help="kill_corrupt: chunks damaged on SSD"
    )
    g.add_argument(
        "--soak-corrupt-records",
        type=count0,
        default=4,
        help="kill_corrupt: journal records damaged",
    )
    g.add_argument("--soak-dtype", default="float32", help="model dtype of both servers")
    g.add_argument("--soak-disk-mib", type=count, default=96, help="the SSD tier's disk")
    g.add_argument("--soak-keep-logs", action="store_true", help="keep the servers' logs")
