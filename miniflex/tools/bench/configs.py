"""The engine configurations a benchmark compares, side by side, on the same engine settings.

=============== ==============================================================
``apc``          vLLM's automatic prefix cache alone (GPU KV only)
``native``       vLLM's ``OffloadingConnector`` (CPU tier of ``cpu_bytes``,
                 ``block_size`` = MiniFlex's chunk); CUDA only
``miniflex-cpu`` MiniFlex, pinned CPU tier of ``cpu_bytes``
``miniflex-ssd`` MiniFlex, CPU tier of ``ssd_cpu_bytes`` (smaller than the
                 working set) over an SSD tier of ``ssd_bytes`` in ``ssd_dir``
``miniflex-sync`` ``miniflex-cpu`` with ``load_mode=sync`` (load, then compute);
``-layerwise``   likewise ``layerwise`` and ``async``: how a hit is loaded
``-async``       (``miniflex bench multiturn``)
``native-fs``    vLLM's ``OffloadingConnector`` with ``TieringOffloadingSpec``:
                 a CPU tier of ``ssd_cpu_bytes`` over an ``fs`` tier in
                 ``ssd_dir``/native-fs; CUDA only
``lmcache``      vLLM's ``LMCacheConnectorV1`` with LMCache's local CPU backend
                 (``max_local_cpu_size`` = ``cpu_bytes``, 256-token chunks, no
                 disk or remote); CUDA only; left out, with the reason, where
                 LMCache cannot be imported or runs without its CUDA kernels
=============== ==============================================================

LMCache takes its settings from ``kv_connector_extra_config`` (``lmcache.*`` keys,
applied over its defaults and any ``LMCACHE_*`` variables); the only things it reads
from the environment alone, usage reporting and its log level, are set by
:meth:`EngineConfig.environment` while the engine starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from miniflex.errors import ConfigError
from miniflex.tools.bench.engines import configuration
from miniflex.tools.bench.lmcache_probe import environ, lmcache_env, lmcache_unavailable

__all__ = [
    "CONFIGS",
    "LMCACHE_NOT_RUN",
    "Connector",
    "EngineConfig",
    "TierSizes",
    "base_name",
    "lmcache_unavailable",
    "parse_configs",
]

MINIFLEX = {
    "kv_connector": "MiniFlexConnector",
    "kv_connector_module_path": "miniflex.connector",
    "kv_role": "kv_both",
}
LMCACHE_NOT_RUN = "not run: lmcache is not among this run's --configs (or was not reached)"
LMCACHE_CHUNK_TOKENS = 256  # LMCache's default chunk, which its vLLM guides keep
GiB = 1 << 30


class Connector(enum.Enum):
    """Which KV connector an engine runs, which decides how hits are counted."""

    NONE = "none"
    NATIVE = "native"
    MINIFLEX = "miniflex"
    LMCACHE = "lmcache"

    @property
    def hits_from_vllm_counter(self) -> bool:
        """Hits come from vLLM's ``vllm:external_prefix_cache_hits`` counter: the connector
        reports none per request (MiniFlex does, in ``kv_transfer_params``)."""
        return self in (Connector.NATIVE, Connector.LMCACHE)


@dataclass(frozen=True)
class TierSizes:
    """Tier sizes shared by every configuration of one run (bytes)."""

    cpu_bytes: int  # MiniFlex's CPU tier, the native connector's, LMCache's local CPU backend
    ssd_cpu_bytes: int  # the CPU tier in front of the SSD tier (miniflex-ssd)
    ssd_bytes: int
    ssd_dir: str | None
    chunk_tokens: int  # MiniFlex's chunk; the native connector offloads blocks this large
    blocks_per_chunk: int | None = None  # None: MiniFlex's "auto"

    def miniflex_extra(self, **extra: Any) -> dict[str, Any]:
        if self.blocks_per_chunk is not None:
            extra["blocks_per_chunk"] = self.blocks_per_chunk
        return extra


@dataclass(frozen=True)
class EngineConfig:
    """One column of a side-by-side run; ``kv_transfer`` builds vLLM's KVTransferConfig."""

    name: str
    connector: Connector
    describe: str
    build: Callable[[TierSizes], dict[str, Any] | None]
    needs_cuda: bool = False
    left_out: str | None = None  # set: never run, this says why
    check: Callable[[], str | None] | None = None  # on CUDA: why it cannot run (None: it can)
    env: Callable[[], dict[str, str]] | None = None  # variables its engine must start with

    def kv_transfer(self, tiers: TierSizes) -> dict[str, Any] | None:
        """``KVTransferConfig`` keyword arguments (None: no connector)."""
        return self.build(tiers)

    def unavailable(self, on_cuda: bool) -> str | None:
        """Why this configuration cannot run here (None: it can)."""
        if self.left_out:
            return self.left_out
        if self.needs_cuda and not on_cuda:
            if self.connector is Connector.LMCACHE:
                return "skipped: LMCache's vLLM connector moves KV with CUDA kernels; CUDA only"
            return (
                "skipped: vLLM's OffloadingConnector runs on CUDA, ROCm and XPU only and "
                "refuses the CPU backend"
            )
        return self.check() if self.check else None

    @contextlib.contextmanager
    def environment(self) -> Iterator[None]:
        """Set :attr:`env` while the engine starts (its processes inherit it), then restore."""
        with environ(self.env() if self.env else {}):
            yield


def _native(t: TierSizes) -> dict[str, Any]:
    # vLLM 0.26's CPUOffloadingSpec: cpu_bytes_to_use (required); block_size =
    # tokens per offloaded block, a multiple of vLLM's block size.
    extra = {"cpu_bytes_to_use": t.cpu_bytes, "block_size": t.chunk_tokens}
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def _native_fs(t: TierSizes) -> dict[str, Any]:
    # vLLM 0.26's TieringOffloadingSpec: the CPU tier of CPUOffloadingSpec plus
    # secondary tiers; the "fs" tier takes root_dir (one file per block).
    if not t.ssd_dir:
        raise ConfigError("--ssd-dir", t.ssd_dir, "a directory for the fs tier's files")
    extra = {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": t.ssd_cpu_bytes,
        "block_size": t.chunk_tokens,
        "secondary_tiers": [{"type": "fs", "root_dir": f"{t.ssd_dir}/native-fs"}],
    }
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def _lmcache(t: TierSizes) -> dict[str, Any]:
    # LMCache's own vLLM adapter (vLLM's LMCacheConnectorV1 without use_native) applies the
    # "lmcache."-prefixed keys over its configuration; its sizes are in GiB ("GB" there is
    # 1024**3 bytes). Disk and remote are set off explicitly, over any LMCACHE_* variable.
    extra = {
        "lmcache.chunk_size": LMCACHE_CHUNK_TOKENS,
        "lmcache.local_cpu": True,
        "lmcache.max_local_cpu_size": t.cpu_bytes / GiB,
        "lmcache.local_disk": None,
        "lmcache.max_local_disk_size": 0,
        "lmcache.remote_url": None,
    }
    return {
        "kv_connector": "LMCacheConnectorV1",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def _miniflex_cpu(t: TierSizes) -> dict[str, Any]:
    return {**MINIFLEX, "kv_connector_extra_config": t.miniflex_extra(cpu_bytes=t.cpu_bytes)}


def _miniflex_mode(mode: str) -> Callable[[TierSizes], dict[str, Any]]:
    def build(t: TierSizes) -> dict[str, Any]:
        extra = t.miniflex_extra(cpu_bytes=t.cpu_bytes, load_mode=mode)
        return {**MINIFLEX, "kv_connector_extra_config": extra}

    return build


def _miniflex_ssd(t: TierSizes) -> dict[str, Any]:
    if not t.ssd_dir:
        raise ConfigError("--ssd-dir", t.ssd_dir, "a directory for the SSD tier's data file")
    extra = t.miniflex_extra(cpu_bytes=t.ssd_cpu_bytes, ssd_dirs=t.ssd_dir, ssd_bytes=t.ssd_bytes)
    return {**MINIFLEX, "kv_connector_extra_config": extra}


CONFIGS: dict[str, EngineConfig] = {
    c.name: c
    for c in (
        EngineConfig("apc", Connector.NONE, "vLLM APC alone", lambda t: None),
        EngineConfig(
            "native",
            Connector.NATIVE,
            "vLLM OffloadingConnector, CPU tier",
            _native,
            needs_cuda=True,
        ),
        EngineConfig(
            "miniflex-cpu",
            Connector.MINIFLEX,
            "MiniFlex, CPU tier",
            _miniflex_cpu,
        ),
        EngineConfig(
            "miniflex-ssd",
            Connector.MINIFLEX,
            "MiniFlex, small CPU tier + SSD tier",
            _miniflex_ssd,
        ),
        EngineConfig(
            "native-fs",
            Connector.NATIVE,
            "vLLM OffloadingConnector, small CPU tier + fs tier",
            _native_fs,
            needs_cuda=True,
        ),
        EngineConfig(
            "lmcache",
            Connector.LMCACHE,
            "LMCache, local CPU backend",
            _lmcache,
            needs_cuda=True,
            check=lmcache_unavailable,
            env=lmcache_env,
        ),
        *(
            EngineConfig(
                f"miniflex-{mode}",
                Connector.MINIFLEX,
                f"MiniFlex, CPU tier, load_mode={mode}",
                _miniflex_mode(mode),
            )
            for mode in ("sync", "layerwise", "async")
        ),
    )
}


def parse_configs(text: str) -> list[EngineConfig]:
    """``"apc,miniflex-cpu"`` -> configurations in that order; an unknown name lists the valid.

    A MiniFlex configuration takes settings after ``+`` (``miniflex-cpu+store=false``): a
    variant with those MiniFlex settings on top, named by the whole text, so that two
    settings can be compared in one run. A suffix ``#N`` (``miniflex-cpu#2``) starts
    another engine of the same configuration, under that name: rows of one configuration
    from two engines give the spread between engines, against which a difference between
    configurations is read (``apc,miniflex-cpu,miniflex-ssd,miniflex-cpu#2,miniflex-ssd#2``
    interleaves them).
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError("--configs", text, "one or more of " + ", ".join(CONFIGS))
    if len(set(names)) != len(names):
        raise ConfigError("--configs", text, "each configuration at most once")
    return [_config(n) for n in names]


def base_name(name: str) -> str:
    """The built-in configuration a ``--configs`` name starts from, without its ``+``
    settings and ``#N`` repeat (``miniflex-ssd+store=false#2`` -> ``miniflex-ssd``)."""
    return configuration(name).partition("+")[0]


def _config(text: str) -> EngineConfig:
    spec, hash_, repeat = text.partition("#")
    if hash_ and not (repeat.isdigit() and int(repeat) >= 2):
        raise ConfigError(
            "--configs", text, "expected a repeat number of 2 or more after '#' (NAME#2)"
        )
    config = _configured(spec)
    return dataclasses.replace(config, name=text) if hash_ else config


def _configured(text: str) -> EngineConfig:
    name, *settings = text.split("+")
    base = CONFIGS.get(name)
    if base is None:
        raise ConfigError("--configs", name, "expected one of " + ", ".join(CONFIGS))
    if not settings:
        return base
    if base.connector is not Connector.MINIFLEX:
        raise ConfigError("--configs", text, "settings after '+' apply to MiniFlex only")
    extra: dict[str, str] = {}
    for item in settings:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ConfigError("--configs", text, f"expected KEY=VALUE after '+', got {item!r}")
        extra[key.strip()] = value.strip()
    from miniflex.config import MiniFlexConfig

    MiniFlexConfig.from_dict(extra, env={})  # unknown keys and bad values fail here
    return with_settings(base, extra, name=text)


def with_settings(base: EngineConfig, extra: dict[str, str], name: str = "") -> EngineConfig:
    """MiniFlex configuration ``base`` with the settings ``extra`` on top (named ``name``,
    default ``base``'s); the settings are not checked here."""

    def build(t: TierSizes) -> dict[str, Any] | None:
        kv = base.build(t)
        assert kv is not None
        return {**kv, "kv_connector_extra_config": {**kv["kv_connector_extra_config"], **extra}}

    shown = ", ".join(f"{k}={v}" for k, v in extra.items())
    return dataclasses.replace(
        base, name=name or base.name, describe=f"{base.describe}, {shown}", build=build
    )
