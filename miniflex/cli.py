"""The ``miniflex`` command line: ``miniflex demo`` (more subcommands arrive with their issues)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from miniflex.demo_core import run_core_demo

    run_core_demo(prompts=args.prompts, chunks_per_prompt=args.chunks, cpu_slots=args.cpu_slots)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="miniflex", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="store and reload chunks through the CPU tier, show hits")
    demo.add_argument("--prompts", type=int, default=8, help="distinct prompts (default 8)")
    demo.add_argument("--chunks", type=int, default=16, help="chunks per prompt (default 16)")
    demo.add_argument("--cpu-slots", type=int, default=64, help="CPU tier slots (default 64)")
    demo.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
