"""The one frozen MiniFlex configuration.

Built once at the boundary from vLLM's ``kv_connector_extra_config`` dict, with
``MINIFLEX_<KEY>`` environment overrides, then passed explicitly to whoever
needs it. This is the only module that reads environment variables.

Example::

    cfg = MiniFlexConfig.from_dict({"cpu_bytes": "8GiB", "blocks_per_chunk": 4})
    cfg.cpu_bytes  # 8589934592

Every field is documented in ``docs/config.md``; ``config_table()`` renders
that table from the field specs below, and a test keeps the two identical.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from miniflex.config_remote import REMOTE_SPECS, check_remote, read_password, tls_on
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

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
AUTO_CHUNK_TOKENS = 64
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_SIZE_HELP = "expected bytes as an integer or a size such as '512MiB', '8GiB' or '1.5GB'"


def parse_size(key: str, value: object) -> int:
    """Parse ``8GiB``, ``1.5GB``, ``4096`` or an int into bytes; ConfigError otherwise."""
    if isinstance(value, bool):
        raise ConfigError(key, value, _SIZE_HELP)
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(key, value, _SIZE_HELP + " (not negative)")
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m and m.group(2).lower() in _UNITS:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise ConfigError(key, value, _SIZE_HELP)


def _parse_int(key: str, value: object, lo: int, hi: int) -> int:
    accepted = f"expected an integer from {lo} to {hi}" + (
        " or 'auto'" if key == "blocks_per_chunk" else ""
    )
    if isinstance(value, bool):
        raise ConfigError(key, value, accepted)
    try:
        n = int(value) if isinstance(value, (int, str)) else None
    except ValueError:
        n = None
    if n is None or not lo <= n <= hi:
        raise ConfigError(key, value, accepted)
    return n


def _parse_chunk_blocks(key: str, value: object) -> int | None:
    if value is None or value == "auto":
        return None
    try:
        return _parse_int(key, value, 1, 1024)
    except ConfigError:
        raise ConfigError(key, value, "expected 'auto' or an integer from 1 to 1024") from None


def _parse_choice(key: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value.lower() not in choices:
        raise ConfigError(key, value, "expected one of " + ", ".join(repr(c) for c in choices))
    return value.lower()


def _parse_bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in (
        "1",
        "true",
        "yes",
        "on",
        "0",
        "false",
        "no",
        "off",
    ):
        return value.lower() in ("1", "true", "yes", "on")
    raise ConfigError(key, value, "expected true or false")


def _parse_path(key: str, value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(key, value, "expected a file path")
    parent = os.path.dirname(os.path.abspath(value))
    if not os.path.isdir(parent):
        raise ConfigError(key, value, f"the directory {parent} must exist")
    return value


def total_memory_bytes() -> int:
    """Physical memory of this machine, the ceiling for the pinned CPU pool."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class _Spec:
    parse: Callable[[str, object], Any]
    default: Any
    doc: str
    shown_default: str


def _size(default: str, doc: str) -> _Spec:
    return _Spec(parse_size, parse_size("default", default), doc, default)


_EVICTION = ("lru", "fifo")
_MOVERS = ("auto", "cpu", "kernel", "dma", "staged")
_SSD_IO = ("auto", "io_uring", "threads")
_SSD_WRITE = ("back", "through")
_HIT_POLICIES = ("cost", "load", "cpu")
_LOAD_MODES = ("auto", "layerwise", "sync", "async")


def _parse_dirs(key: str, value: object) -> tuple[str, ...]:
    """A comma-separated string (or a list) of existing directories; empty: none."""
    if value is None or value == "":
        return ()
    parts = value.split(",") if isinstance(value, str) else value
    if not isinstance(parts, (list, tuple)) or not all(isinstance(p, str) for p in parts):
        raise ConfigError(key, value, "expected directories as a list or a comma-separated string")
    dirs = tuple(p.strip() for p in parts if p.strip())
    for d in dirs:
        if not os.path.isdir(d):
            raise ConfigError(
                key, value, f"{d!r} is not an existing directory; create it or fix the path"
            )
    if len({os.path.realpath(d) for d in dirs}) != len(dirs):
        raise ConfigError(key, value, "expected distinct directories (one data file each)")
    return dirs


def _parse_auto_size(key: str, value: object) -> int | None:
    """``auto`` (None: derived) or a size."""
    return None if value is None or value == "auto" else parse_size(key, value)


def _parse_auto_float(key: str, value: object) -> float | None:
    """``auto`` (None: measured) or a positive number."""
    if value is None or value == "auto":
        return None
    try:
        x = float(value) if isinstance(value, (int, float, str)) and value is not True else None
    except ValueError:
        x = None
    if x is None or not x > 0 or x == float("inf"):
        raise ConfigError(key, value, "expected 'auto' or a positive number")
    return x


def default_tune_cache(env: Mapping[str, str] | None = None) -> str:
    """``$XDG_CACHE_HOME/miniflex/tune.json`` (``~/.cache`` when unset)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "miniflex", "tune.json")


_SPECS: dict[str, _Spec] = {
    "cpu_bytes": _size(
        "4GiB",
        "Size of the CPU tier of the engine (pinned host memory). With tensor parallelism "
        "each rank's pool gets an equal share (an MLA model's latent cache is the same on every "
        "rank: one pool, which all ranks map, gets it all). Each pool must hold at least one "
        "chunk; the total must be below the machine's physical memory.",
    ),
    "cpu_pool_file": _Spec(
        lambda k, v: _parse_path(k, v),
        None,
        "Back the CPU pool by a shared mapping of this file (one per TP rank: `<path>.<rank>`; "
        "the pool all ranks of an MLA model share: `<path>.<engine id>`, "
        "mode 0600, removed at shutdown) instead of anonymous memory, e.g. under `/dev/shm` so "
        "that tools can inspect a live pool. Empty: anonymous memory.",
        "",
    ),
    "blocks_per_chunk": _Spec(
        _parse_chunk_blocks,
        None,
        "vLLM blocks per chunk, the unit of lookup, allocation, eviction and I/O; a chunk is "
        "`blocks_per_chunk * block_size` tokens. `auto`: the fewest blocks that make at least "
        f"{AUTO_CHUNK_TOKENS} tokens (4 blocks of 16, 2 of 32, 1 of 128).",
        "auto",
    ),
    "cpu_eviction": _Spec(
        lambda k, v: _parse_choice(k, v, _EVICTION),
        "lru",
        "Eviction policy of the CPU tier: " + ", ".join(_EVICTION) + ".",
        "lru",
    ),
    "mover": _Spec(
        lambda k, v: _parse_choice(k, v, _MOVERS),
        "auto",
        "How KV bytes move between vLLM's cache and the CPU pool: `cpu` (torch copies; the "
        "only mover on vLLM's CPU backend), `kernel` (CuPy gather/scatter kernel into mapped "
        "pinned memory), `dma` (batched async memcpy), `staged` (whole slots by the copy engines "
        "through a GPU staging buffer, pages placed by the kernel); `auto`: the tuning cache's "
        "winner for "
        "this GPU and layout, else `staged` on CUDA and `cpu` elsewhere.",
        "auto",
    ),
    "kernel_ctas": _Spec(
        lambda k, v: _parse_int(k, v, 0, 4096),
        0,
        "Thread blocks (CTAs) of every launch of the copy kernel (`kernel` and `staged` "
        "movers); few leave the SMs to vLLM's compute. 0: the tuning cache's value, else the "
        "built-in defaults (2; 8 for the `staged` gather/scatter; 2-8 by size for a load issued "
        "layer by layer).",
        "0",
    ),
    "staging_lane_bytes": _size(
        "32MiB",
        "The `staged` mover's GPU staging buffer: 4 lanes of this size (each at least one chunk "
        "slot), allocated beside vLLM's KV cache. Each step of a store or load moves a lane's "
        "worth of chunks; larger lanes mean fewer Python calls per chunk on the transfer "
        "thread, which shares the interpreter with vLLM's.",
    ),
    "tune_cache": _Spec(
        lambda k, v: _parse_path(k, v),
        None,
        "JSON file where `miniflex tune` stores the fastest mover per GPU, layout and chunk "
        "size, read at start-up. Empty: `$XDG_CACHE_HOME/miniflex/tune.json` "
        "(`~/.cache/miniflex/tune.json`).",
        "",
    ),
    "max_inflight_chunks": _Spec(
        lambda k, v: _parse_int(k, v, 1, 1 << 20),
        4096,
        "Upper bound on chunks being stored at once; further stores are skipped "
        "(and counted in `stores_skipped`) rather than queued without bound.",
        "4096",
    ),
    "store": _Spec(
        _parse_bool,
        True,
        "Save newly computed chunks. `false` makes the cache read-only (loads still work).",
        "true",
    ),
    "ssd_dirs": _Spec(
        _parse_dirs,
        (),
        "Directories of the SSD tier (comma-separated; one preallocated O_DIRECT data file "
        "each, slots striped over them; TP rank r uses the subdirectory `rank<r>`). Empty: no "
        "SSD tier. Chunks found there after a restart with the same model and layout are served.",
        "",
    ),
    "ssd_bytes": _size(
        "16GiB",
        "Size of the SSD tier of the engine, split evenly over the TP ranks' stores (MLA: rank "
        "0's store, the only one, gets it all) and over `ssd_dirs`; checked against each file "
        "system's free space at start-up.",
    ),
    "ssd_write": _Spec(
        lambda k, v: _parse_choice(k, v, _SSD_WRITE),
        "back",
        "`back`: a chunk is written to SSD when the CPU tier evicts it (write-back); "
        "`through`: every chunk stored on CPU is also written to SSD at once.",
        "back",
    ),
    "ssd_write_backlog": _Spec(
        _parse_auto_size,
        None,
        "Write-back: at most this much KV is being written from the CPU tier to SSD at once "
        "(it stays readable in CPU meanwhile). Past that, a store takes the slot of the oldest "
        "write and waits for it if the disk writes a chunk faster than recomputing one takes "
        "(or that write ends within one chunk's recompute); otherwise the evicted chunk is "
        "dropped, counted in `demotions_skipped`, so that a slow disk never holds up stores. "
        "Writes start ahead of "
        "need, from the least recently used chunks, so that this much of the CPU tier is free "
        "or being written. `auto`: the KV of one engine step (`max_num_batched_tokens`), "
        "within 1/8 to 1/2 of the CPU tier.",
        "auto",
    ),
    "ssd_eviction": _Spec(
        lambda k, v: _parse_choice(k, v, _EVICTION),
        "lru",
        "Eviction policy of the SSD tier: " + ", ".join(_EVICTION) + ".",
        "lru",
    ),
    "hit_policy": _Spec(
        lambda k, v: _parse_choice(k, v, _HIT_POLICIES),
        "cost",
        "Which resident chunks a request loads: `cost` (all CPU chunks; SSD chunks only while "
        "loading them is predicted to be faster than recomputing, see docs/design.md), `load` "
        "(everything resident), `cpu` (never SSD-only chunks: they are recomputed).",
        "cost",
    ),
    "load_mode": _Spec(
        lambda k, v: _parse_choice(k, v, _LOAD_MODES),
        "auto",
        "How a hit is loaded: `async` (in the background; the request is computed in a later "
        "engine step), `sync` (before the step's forward, which waits for all of it: "
        "load-then-compute), `layerwise` (in the same step, layer L+1 copying while layer L "
        "computes); `auto`: the cost model picks layerwise or async per request (see "
        "docs/design.md). Chunks read from SSD always load async.",
        "auto",
    ),
    "cpu_load_gbps": _Spec(
        _parse_auto_float,
        None,
        "Cost model: CPU pool -> vLLM cache bandwidth in GB/s. `auto`: learned from loads.",
        "auto",
    ),
    "ssd_read_gbps": _Spec(
        _parse_auto_float,
        None,
        "Cost model: SSD -> CPU pool read bandwidth in GB/s. It also decides admission: while "
        "reading a chunk back is predicted slower than recomputing the costliest chunk, "
        "evicted chunks are not written to SSD (one probe write every 10 s; counted in "
        "`demotions_declined`). `auto`: measured at start-up (each worker reads back up to "
        "256 MiB from a scratch file beside its store), then learned from reads.",
        "auto",
    ),
    "prefill_tokens_per_s": _Spec(
        _parse_auto_float,
        None,
        "Cost model: a fixed prefill speed (tokens/s, no attention term) instead of the one "
        "fitted to the engine's own forward times. `auto`: fitted.",
        "auto",
    ),
    "status_file": _Spec(
        lambda k, v: _parse_path(k, v),
        None,
        "Write the scheduler's live state (tiers, cost model, cumulative counters) to this "
        "JSON file, atomically, every second from a thread of its own, idle or not; the state "
        "is refreshed while busy (at most once a second) and when the engine falls idle. "
        "`miniflex inspect FILE` prints it, its age and whether the engine runs. Empty: off.",
        "",
    ),
    "ssd_io": _Spec(
        lambda k, v: _parse_choice(k, v, _SSD_IO),
        "auto",
        "SSD I/O backend: `io_uring` (raw syscalls through cffi), `threads` "
        "(`preadv`/`pwritev` thread pool); `auto`: io_uring if a probe succeeds, else threads "
        "(logged, and shown in stats).",
        "auto",
    ),
    **{key: _Spec(*spec) for key, spec in REMOTE_SPECS.items()},
}


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
    tune_cache: str | None = field(default=_SPECS["tune_cache"].default)
    ssd_dirs: tuple[str, ...] = field(default=_SPECS["ssd_dirs"].default)
    ssd_bytes: int = field(default=_SPECS["ssd_bytes"].default)
    ssd_write: str = field(default=_SPECS["ssd_write"].default)
    ssd_write_backlog: int | None = field(default=_SPECS["ssd_write_backlog"].default)
    ssd_eviction: str = field(default=_SPECS["ssd_eviction"].default)
    ssd_io: str = field(default=_SPECS["ssd_io"].default)
    hit_policy: str = field(default=_SPECS["hit_policy"].default)
    load_mode: str = field(default=_SPECS["load_mode"].default)
    cpu_load_gbps: float | None = field(default=_SPECS["cpu_load_gbps"].default)
    ssd_read_gbps: float | None = field(default=_SPECS["ssd_read_gbps"].default)
    prefill_tokens_per_s: float | None = field(default=_SPECS["prefill_tokens_per_s"].default)
    status_file: str | None = field(default=_SPECS["status_file"].default)
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
