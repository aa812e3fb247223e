"""The ``miniflex`` command line: demo, serve, bench, tune and inspect."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

from miniflex.errors import MiniFlexError

__all__ = ["main"]


def _int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer from ``lo`` to ``hi`` (no upper bound: None)."""
    want = f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        return value

    parse.__name__ = want  # argparse names the type in some messages
    return parse


def _demo(args: argparse.Namespace) -> int:
    if args.synthetic:
        from miniflex.tools.demo_core import run_core_demo

        run_core_demo(prompts=args.prompts, chunks_per_prompt=args.chunks, cpu_slots=args.cpu_slots)
        return 0
    from miniflex.tools.demo import run_demo

    if args.verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")

    run_demo(prompt_tokens=args.prompt_tokens, json_path=args.json)
    return 0


def _tune(args: argparse.Namespace) -> int:
    from miniflex.tools.tune import command

    return command(args)


def _bench(args: argparse.Namespace) -> int:
    from miniflex.tools.bench import run

    return run(args)


def _inspect(args: argparse.Namespace) -> int:
    from miniflex.tools.inspect_status import inspect_status

    print(inspect_status(args.status_file))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from miniflex.tools.serve import serve

    return serve(args.vllm_args)


def _add_demo(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser(
        "demo", help="real vLLM with and without MiniFlex on a generated model: TTFT and hits"
    )
    demo.add_argument(
        "--prompt-tokens", type=_int_in(256, 16384), default=2048, help="long prompt length"
    )
    demo.add_argument("--json", help="also write the rows as JSON to this file")
    demo.add_argument(
        "--synthetic", action="store_true", help="no vLLM: move chunks through the core only"
    )
    positive = _int_in(1)
    demo.add_argument("--prompts", type=positive, default=8, help="--synthetic: distinct prompts")
    demo.add_argument("--chunks", type=positive, default=16, help="--synthetic: chunks per prompt")
    demo.add_argument("--cpu-slots", type=positive, default=64, help="--synthetic: CPU tier slots")
    demo.set_defaults(func=_demo)


def _add_tune(sub: argparse._SubParsersAction) -> None:
    tune = sub.add_parser(
        "tune", help="time the GPU movers on a model's KV layout; store the fastest per GPU"
    )
    positive = _int_in(1)
    tune.add_argument("--model", required=True, help="model directory or its config.json")
    tune.add_argument("--block-size", type=positive, default=16, help="vLLM block size (tokens)")
    tune.add_argument("--dtype", default="bfloat16", help="KV cache dtype (bfloat16, fp8, ...)")
    tune.add_argument("--chunk-tokens", type=positive, nargs="+", default=[64], help="chunk sizes")
    tune.add_argument("--order", choices=("LBHNC", "LBNHC"), default="LBHNC", help="page order")
    tune.add_argument("--tensor-parallel", type=positive, default=1, help="TP size (KV heads/rank)")
    tune.add_argument(
        "--tokens-per-call", type=positive, default=1024, help="tokens per timed call"
    )
    tune.add_argument("--ctas", type=positive, nargs="+", help="kernel CTA counts to try")
    tune.add_argument("--repeat", type=positive, default=10, help="timed calls per direction")
    tune.add_argument("--cache", help="tuning cache file (default: the tune_cache setting)")
    tune.add_argument("--no-save", action="store_true", help="print only; leave the cache alone")
    tune.set_defaults(func=_tune)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="miniflex", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_demo(sub)
    srv = sub.add_parser(
        "serve",
        help="vllm serve with MiniFlex (reads MODEL, PORT, MINIFLEX_*)",
        description="Arguments after 'serve' go to vllm serve unchanged.",
    )
    srv.add_argument("vllm_args", nargs=argparse.REMAINDER, help="vllm serve arguments")
    srv.set_defaults(func=_serve)
    insp = sub.add_parser(
        "inspect",
        help="print a running engine's tiers, cost model and counters, how old they are and "
        "whether it runs (status_file)",
    )
    insp.add_argument("status_file", help="the file configured as status_file")
    insp.set_defaults(func=_inspect)
    _add_tune(sub)
    bench = sub.add_parser(
        "bench", help="TTFT, overflow, mixed, overhead and soak benchmarks: vLLM alone vs MiniFlex"
    )
    from miniflex.tools.bench import add_arguments

    add_arguments(bench)
    bench.set_defaults(func=_bench)
    args, unknown = parser.parse_known_args(argv)
    if args.command == "serve":
        args.vllm_args = unknown + args.vllm_args  # everything after 'serve' goes to vLLM
    elif unknown:
        parser.error("unrecognized arguments: " + " ".join(unknown))
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except MiniFlexError as exc:
        print(f"miniflex: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
