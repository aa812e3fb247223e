"""The one frozen MiniFlex configuration.

Built once at the boundary from vLLM's ``kv_connector_extra_config`` dict, with
``MINIFLEX_<KEY>`` environment overrides, then passed explicitly to whoever
needs it. This is the only module that reads environment variables.

Example::

    cfg = MiniFlexConfig.from_dict({"cpu_bytes": "8GiB", "blocks_per_chunk": 4})
    cfg.cpu_bytes  # 8589934592

Every field is documented in ``docs/config.md``; ``config_table()`` renders
that table from the field specs (``miniflex/config/specs.py``; their parsers are in
``miniflex/config/parse.py``), and a test keeps the two identical.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from miniflex.config.parse import parse_size
from miniflex.config.remote import check_remote, read_password, tls_on
from miniflex.config.specs import AUTO_CHUNK_TOKENS
from miniflex.config.specs import SPECS as _SPECS
from miniflex.errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "MiniFlexConfig",
    "config_table",
    "default_tune_cache",
    "hash_seed_set",
    "serve_environment",
    "parse_size",
    "serve_settings",
    "total_memory_bytes",
]

ENV_PREFIX = "MINIFLEX_"


def total_memory_bytes() -> int:
    """Physical memory of this machine, the ceiling for the pinned CPU pool."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_tune_cache(env: Mapping[str, str] | None = None) -> str:
    """``$XDG_CACHE_HOME/miniflex/tune.json`` (``~/.cache`` when unset)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "miniflex", "tune.json")


@dataclass(frozen=True)
class MiniFlexConfig:
    """Every MiniFlex setting, validated. See ``docs/config.md`` for the table."""

    cpu_bytes: int = field(default=_SPECS["cpu_bytes"].default)
    cpu_pool_file: str | None = field(default=_SPECS["cpu_pool_file"].default)
    blocks_per_chunk: int | None = field(default=_SPECS["blocks_per_chunk"].default)
    cpu_eviction: str = field(default=_SPECS["cpu_eviction"].default)
    mover: str = field(default=_SPECS["mover"].default)
    max_inflight_chunks: int = field(default=_SPECS["max_inflight_chunks"].default)
    store: bool = field(default=_SPECS["store"].default)
    kernel_ctas: int = field(default=_SPECS["kernel_ctas"].default)
    staging_lane_bytes: int = field(default=_SPECS["staging_lane_bytes"].default)
    staging_stores: str = field(default=_SPECS["staging_stores"].default)
    tune_cache: str | None = field(default=_SPECS["tune_cache"].default)
    ssd_dirs: tuple[str, ...] = field(default=_SPECS["ssd_dirs"].default)
    ssd_bytes: int = field(default=_SPECS["ssd_bytes"].default)
    ssd_write: str = field(default=_SPECS["ssd_write"].default)
    ssd_write_backlog: int | None = field(default=_SPECS["ssd_write_backlog"].default)
    ssd_stream_bytes: int = field(default=_SPECS["ssd_stream_bytes"].default)
    ssd_eviction: str = field(default=_SPECS["ssd_eviction"].default)
    ssd_io: str = field(default=_SPECS["ssd_io"].default)
    hit_policy: str = field(default=_SPECS["hit_policy"].default)
    load_mode: str = field(default=_SPECS["load_mode"].default)
    backfill_s: float = field(default=_SPECS["backfill_s"].default)
    cpu_load_gbps: float | None = field(default=_SPECS["cpu_load_gbps"].default)
    ssd_read_gbps: float | None = field(default=_SPECS["ssd_read_gbps"].default)
    prefill_tokens_per_s: float | None = field(default=_SPECS["prefill_tokens_per_s"].default)
    status_file: str | None = field(default=_SPECS["status_file"].default)
    trace_file: str | None = field(default=_SPECS["trace_file"].default)
    remote_url: str | None = field(default=_SPECS["remote_url"].default)
    remote_user: str | None = field(default=_SPECS["remote_user"].default)
    remote_password: str | None = field(default=_SPECS["remote_password"].default, repr=False)
    remote_password_file: str | None = field(default=_SPECS["remote_password_file"].default)
    remote_prefix: str = field(default=_SPECS["remote_prefix"].default)
    remote_tls: bool = field(default=_SPECS["remote_tls"].default)
    remote_tls_ca_file: str | None = field(default=_SPECS["remote_tls_ca_file"].default)
    remote_tls_cert_file: str | None = field(default=_SPECS["remote_tls_cert_file"].default)
    remote_tls_key_file: str | None = field(default=_SPECS["remote_tls_key_file"].default)
    remote_timeout_s: float = field(default=_SPECS["remote_timeout_s"].default)
    remote_retry_s: float = field(default=_SPECS["remote_retry_s"].default)
    remote_write: str = field(default=_SPECS["remote_write"].default)
    remote_write_backlog: int = field(default=_SPECS["remote_write_backlog"].default)
    remote_read_gbps: float | None = field(default=_SPECS["remote_read_gbps"].default)
    remote_fetch_streams: int | None = field(default=_SPECS["remote_fetch_streams"].default)
    remote_copy_threads: int = field(default=_SPECS["remote_copy_threads"].default)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            # Re-validate so that direct construction is as safe as from_dict().
            object.__setattr__(self, f.name, _SPECS[f.name].parse(f.name, getattr(self, f.name)))
        mem = total_memory_bytes()
        if self.cpu_bytes >= mem:
            raise ConfigError(
                "cpu_bytes",
                self.cpu_bytes,
                f"must be below this machine's physical memory ({mem} bytes, "
                f"{mem / 2**30:.1f} GiB)",
            )
        check_remote({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

    @classmethod
    def from_dict(
        cls, extra: Mapping[str, object] | None = None, env: Mapping[str, str] | None = None
    ) -> MiniFlexConfig:
        """Build from ``kv_connector_extra_config``; ``MINIFLEX_<KEY>`` variables override it.

        ``env`` defaults to ``os.environ``. Unknown keys, in either source, raise
        ConfigError listing the valid keys, so typos are never silently ignored.
        """
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for key, value in (extra or {}).items():
            values[_known(key, value)] = value
        for name, value in env.items():
            if name.startswith(ENV_PREFIX):
                values[_known(name[len(ENV_PREFIX) :].lower(), value, name)] = value
        return cls(**{k: _SPECS[k].parse(k, v) for k, v in values.items()})

    @property
    def remote_tls_on(self) -> bool:
        """TLS to the remote store: ``remote_tls``, or a ``rediss://`` / ``valkeys://`` URL."""
        return tls_on(self.remote_url, self.remote_tls)

    def remote_secret(self) -> str | None:
        """The remote store's password: ``remote_password``, else ``remote_password_file``'s."""
        if self.remote_password_file:
            return read_password(self.remote_password_file)
        return self.remote_password

    def public_dict(self) -> dict[str, Any]:
        """Every setting as a dict for logs and result files, the password masked."""
        out = dataclasses.asdict(self)
        if out["remote_password"]:
            out["remote_password"] = "<hidden>"
        return out

    def chunk_blocks(self, block_size: int) -> int:
        """``blocks_per_chunk`` resolved for vLLM's block size (``auto`` -> >= 64 tokens)."""
        if self.blocks_per_chunk is not None:
            return self.blocks_per_chunk
        return max(1, -(-AUTO_CHUNK_TOKENS // block_size))

    def replace(self, **changes: object) -> MiniFlexConfig:
        """A copy with some fields changed (validated like the original)."""
        for key, value in changes.items():
            _known(key, value)
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def _known(key: str, value: object, shown: str | None = None) -> str:
    if key not in _SPECS:
        raise ConfigError(shown or key, value, "unknown key; valid keys are " + ", ".join(_SPECS))
    return key


def hash_seed_set(env: Mapping[str, str] | None = None) -> bool:
    """True if ``PYTHONHASHSEED`` is set (vLLM then derives its block hashes from it)."""
    env = os.environ if env is None else env
    return env.get("PYTHONHASHSEED") is not None


def serve_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment ``miniflex serve`` starts vLLM with.

    With an SSD or remote tier configured, ``PYTHONHASHSEED`` defaults to ``0``
    so that vLLM's block hashes, and so MiniFlex's chunk keys, are the same
    after a restart and in every replica: chunks on SSD and in the shared store
    are found again.
    """
    out = dict(os.environ if env is None else env)
    shared = out.get(ENV_PREFIX + "SSD_DIRS") or out.get(ENV_PREFIX + "REMOTE_URL")
    if shared and not hash_seed_set(out):
        out["PYTHONHASHSEED"] = "0"
    return out


def serve_settings(env: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """``(MODEL, PORT)`` for ``miniflex serve``; either may be unset (None)."""
    env = os.environ if env is None else env
    return env.get("MODEL") or None, env.get("PORT") or None


def config_table() -> str:
    """The Markdown table of every field, as published in ``docs/config.md``."""
    rows = ["| key | environment | default | meaning |", "|---|---|---|---|"]
    for key, spec in _SPECS.items():
        rows.append(
            f"| `{key}` | `{ENV_PREFIX}{key.upper()}` | `{spec.shown_default}` | {spec.doc} |"
        )
    return "\n".join(rows) + "\n"
