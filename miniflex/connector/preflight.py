"""Every setting MiniFlex can check before vLLM starts, against the model and the machine.

``miniflex serve`` calls :func:`check_before_start` with vLLM's command line
before it execs vLLM, and :func:`~miniflex.tools.offline_llm.make_llm` with its
engine arguments before it builds ``LLM``; the connector itself checks the SSD
tier first thing in each worker (plain ``LLM(...)`` users get the same
messages, only later). Each refusal is one :class:`~miniflex.errors.ConfigError`
line naming the setting, its value and the fix::

    miniflex: error: MiniFlex config model='/nonexistent/model': no such directory; ...
    miniflex: error: MiniFlex config cpu_bytes='64.0 KiB': holds no chunk of this model; ...

What is checked: the model is a directory with a ``config.json``, or a
Hugging Face repo id that this machine's cache or the Hub has; ``cpu_bytes``
holds one chunk of this model; the SSD tier's directories
(:func:`~miniflex.ssd.preflight.check_ssd_tier`); the SSD I/O backend; the
remote store's credentials. Nothing here imports vLLM, so it runs in a second
(plus one request to the Hub for a repo id that is not cached).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

from miniflex.config import MiniFlexConfig
from miniflex.errors import ConfigError
from miniflex.layout import KVGeometry
from miniflex.model_identity import hub_cached_config
from miniflex.model_shape import ModelShape
from miniflex.ranks import SINGLE_RANK, TPPlacement
from miniflex.remote import tier as remote_tier
from miniflex.ssd.backends import describe_backend
from miniflex.ssd.preflight import check_ssd_tier
from miniflex.units import format_bytes

__all__ = [
    "EngineArgs",
    "check_before_start",
    "check_cpu_bytes",
    "check_hub",
    "check_model",
    "check_worker",
    "chunk_geometry",
]

HUB_TIMEOUT_S = 10.0
"""How long :func:`check_hub` waits for the Hugging Face Hub's answer."""

SMALLEST_BLOCK = 16
"""vLLM's smallest default block size (CUDA); the CPU backend's default is 128."""


@dataclass(frozen=True)
class EngineArgs:
    """The vLLM settings that size a chunk; None where vLLM picks its default."""

    block_size: int | None = None
    tp_size: int = 1
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"

    @classmethod
    def from_cli(cls, args: Sequence[str]) -> EngineArgs:
        """From ``vllm serve`` arguments (unknown ones are ignored)."""
        p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        p.add_argument("--block-size", type=int)
        p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
        p.add_argument("--dtype", default="auto")
        p.add_argument("--kv-cache-dtype", default="auto")
        known, _ = p.parse_known_args(list(args))
        return cls(known.block_size, known.tensor_parallel_size, known.dtype, known.kv_cache_dtype)

    def itemsize(self) -> int:
        """Bytes per KV element: fp8 caches 1; ``auto`` never more than 2 (vLLM runs a
        float32 checkpoint in 16 bits unless told otherwise)."""
        if self.kv_cache_dtype.startswith("fp8"):
            return 1
        return 4 if self.dtype in ("float32", "float") else 2


def check_model(model: str, key: str = "model") -> ModelShape | None:
    """The model's shape from its ``config.json``; None where it cannot be known here.

    A local path must be a directory with a ``config.json``; a Hugging Face
    repo id is looked up in the local cache, else asked of the Hub
    (:func:`check_hub`), and vLLM downloads it later.
    """
    if os.path.isdir(model):
        if os.path.exists(os.path.join(model, "config.json")):
            return _shape_or_none(model, key)
        if os.path.exists(os.path.join(model, "params.json")):
            return None  # a Mistral-format checkpoint: vLLM reads it, MiniFlex cannot size it
        raise ConfigError(key, model, "has no config.json; give the directory of a model")
    if os.path.isfile(model) and model.endswith(".gguf"):
        return None
    if _looks_like_path(model):
        raise ConfigError(
            key,
            model,
            "no such directory; give a local model directory (with its config.json) or a "
            "Hugging Face repo id such as 'Qwen/Qwen3-8B'",
        )
    cached = hub_cached_config(model)
    if cached is None:
        check_hub(model, key)
        return None
    return _shape_or_none(os.path.dirname(cached), key)


def chunk_geometry(
    shape: ModelShape, config: MiniFlexConfig, engine: EngineArgs
) -> KVGeometry | None:
    """One TP rank's chunk, as small as vLLM could make it with these arguments (so a
    check against it never refuses what vLLM would accept)."""
    block = engine.block_size or SMALLEST_BLOCK
    itemsize = engine.itemsize()
    return shape.geometry(block, config.chunk_blocks(block), itemsize, engine.tp_size)


def check_before_start(
    model: str, config: MiniFlexConfig, engine: EngineArgs, key: str = "model"
) -> list[str]:
    """Refuse (ConfigError) what cannot run; returns what was checked, one line each."""
    shape = check_model(model, key)
    geometry = None if shape is None else chunk_geometry(shape, config, engine)
    lines = []
    placement = TPPlacement(engine.tp_size, replicated=shape is not None and shape.latent)
    if geometry is None:
        lines.append(f"model {model}: its KV size is not known here; vLLM checks cpu_bytes")
    else:
        check_cpu_bytes(config, geometry, placement)
        lines.append(
            f"model {model}: a chunk of {geometry.chunk_tokens} tokens is at least "
            f"{format_bytes(geometry.slot_bytes)}; the CPU tier ({format_bytes(config.cpu_bytes)})"
            f" holds {placement.per_store(config.cpu_bytes) // geometry.slot_bytes} of them"
        )
    if config.ssd_dirs:
        slot = None if geometry is None else geometry.slot_bytes
        per_rank = placement.per_store(config.ssd_bytes)
        found = check_ssd_tier(config.ssd_dirs, per_rank, slot, ranks=placement.store_ranks())
        lines.append(f"{found.describe()}; I/O: {describe_backend(config.ssd_io)}")
    if config.remote_url:
        lines.append(remote_tier.check_store(config))
    return lines


def check_worker(
    config: MiniFlexConfig, geometry: KVGeometry, rank: int, placement: TPPlacement = SINGLE_RANK
) -> None:
    """The connector's first check in a worker, with the engine's real KV geometry, before
    it allocates or creates anything: the CPU tier, and this rank's SSD directories (a
    replicated cache's rank > 0 has none)."""
    check_cpu_bytes(config, geometry, placement)
    if config.ssd_dirs and placement.writes(rank):
        check_ssd_tier(
            config.ssd_dirs,
            placement.per_store(config.ssd_bytes),
            geometry.slot_bytes,
            ranks=(rank,),
        )


def check_cpu_bytes(
    config: MiniFlexConfig, geometry: KVGeometry, placement: TPPlacement = SINGLE_RANK
) -> None:
    """ConfigError unless each CPU pool (``cpu_bytes`` is the engine's, split over the TP
    ranks' pools) holds at least one chunk of ``geometry`` (one rank's)."""
    if placement.per_store(config.cpu_bytes) >= geometry.slot_bytes:
        return
    need = geometry.slot_bytes * placement.stores
    pools = f", over {placement.stores} TP ranks' pools" if placement.stores > 1 else ""
    raise ConfigError(
        "cpu_bytes",
        format_bytes(config.cpu_bytes),
        f"holds no chunk of this model{pools}: a chunk of {geometry.chunk_tokens} tokens "
        f"({geometry.num_layers} layers, {geometry.num_kv_heads} KV heads of "
        f"{geometry.head_size}) is {format_bytes(geometry.slot_bytes)} per rank; set it "
        f"(MINIFLEX_CPU_BYTES) to at least {format_bytes(need)}",
    )


def _shape_or_none(model: str, key: str) -> ModelShape | None:
    try:
        return ModelShape.from_dir(model, key)
    except ConfigError:
        raise
    except (KeyError, TypeError, ValueError):
        return None  # not a plain decoder config (MLA, SSM, ...): the connector checks later


def _looks_like_path(model: str) -> bool:
    """A repo id is ``org/name`` (or ``name``); anything else that is missing is a path."""
    return model.startswith(("/", ".", "~")) or model.count("/") > 1


def check_hub(repo_id: str, key: str = "model") -> None:
    """ConfigError unless the Hugging Face Hub (``HF_ENDPOINT``) can give vLLM ``repo_id``.

    One request of at most :data:`HUB_TIMEOUT_S`. Without it, a typo such as
    ``mdoel/tiny`` (meant as a local path) starts vLLM, which fails on the
    download a minute later in a page of tracebacks.
    """
    try:
        from huggingface_hub import HfApi, constants, errors
    except ImportError:
        return  # vLLM brings it; without it, vLLM says what is missing
    where = "no such local directory, and not in this machine's Hugging Face cache"
    if constants.HF_HUB_OFFLINE:
        fix = "HF_HUB_OFFLINE is set, so vLLM cannot download it; give a local model directory"
        raise ConfigError(key, repo_id, f"{where}; {fix}")
    try:
        HfApi().model_info(repo_id, timeout=HUB_TIMEOUT_S)
    except errors.GatedRepoError as e:
        fix = "accept its terms on the Hub and set HF_TOKEN"
        raise ConfigError(key, repo_id, f"a gated repo this machine may not read; {fix}") from e
    except (errors.RepositoryNotFoundError, errors.HFValidationError) as e:
        fix = "give a local model directory, or fix the name (a private repo needs HF_TOKEN)"
        raise ConfigError(key, repo_id, f"{where}, and the Hub has no such repo; {fix}") from e
    except Exception as e:  # the network, the endpoint: vLLM could not download it either
        why = f"{type(e).__name__}: {e}".splitlines()[0]
        fix = "give a local model directory, or check the network and HF_ENDPOINT"
        hub = f"the Hub ({constants.ENDPOINT}) cannot be reached ({why})"
        raise ConfigError(key, repo_id, f"{where}, and {hub}; {fix}") from e
