"""The tuning cache: the fastest mover per GPU, KV layout and chunk size, as JSON.

``miniflex tune`` writes it; :func:`miniflex.gpu.registry.make_mover` reads it
at start-up (mover ``auto``, and the kernel's CTAs when ``kernel_ctas`` is 0).
The file holds one entry per key::

    {"version": 1, "entries": {
        "NVIDIA H200|LBHNC|L36xH8xD128xN16|bfloat16|64tok|dense":
            {"mover": "kernel", "ctas": 16, "vec": 16,
             "store_gbps": 51.2, "load_gbps": 50.8}}}

Writes replace the file atomically (a temporary file in the same directory,
then ``os.replace``), so a reader never sees half a file, and entries for
other keys are kept.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from miniflex.errors import ConfigError
from miniflex.layout import KVLayout

__all__ = ["VERSION", "TuneChoice", "lookup", "read_cache", "tune_key", "write_choice"]

VERSION = 1
_MOVERS = ("kernel", "dma", "staged", "cpu")


@dataclass(frozen=True)
class TuneChoice:
    """What tuning chose for one key; ``ctas``/``vec`` are the best kernel settings.

    They are kept even when another mover won, so ``mover=kernel`` with
    ``kernel_ctas=0`` still runs the kernel as tuned.
    """

    mover: str
    ctas: int | None = None
    vec: int | None = None
    store_gbps: float = 0.0
    load_gbps: float = 0.0

    def __post_init__(self) -> None:
        assert self.mover in _MOVERS, self.mover


def tune_key(gpu_name: str, layout: KVLayout) -> str:
    """The cache key: GPU model, page order, geometry, dtype, chunk size, padding."""
    g = layout.geometry
    padding = "dense" if layout.block_stride == g.page_bytes else "padded"
    return (
        f"{gpu_name}|{layout.order}|L{g.num_layers}xH{g.num_kv_heads}xD{g.head_size}"
        f"xN{g.block_size}|{g.dtype}|{g.chunk_tokens}tok|{padding}"
    )


def read_cache(path: str | Path) -> dict[str, TuneChoice]:
    """Every entry of the cache at ``path``; {} if there is no file.

    A file that is not a cache of this version raises ConfigError naming
    the ``tune_cache`` key, so a damaged file is reported, not ignored.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    fix = "a JSON file written by 'miniflex tune' (delete it and tune again)"
    try:
        data = json.loads(text)
        version = data.get("version") if isinstance(data, dict) else None
    except ValueError as exc:
        raise ConfigError("tune_cache", str(path), f"{fix}; it is not JSON: {exc}") from exc
    if version != VERSION:
        raise ConfigError("tune_cache", str(path), f"{fix}; its version is {version!r}")
    try:
        return {key: _choice(entry) for key, entry in data["entries"].items()}
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError) as exc:
        raise ConfigError("tune_cache", str(path), f"{fix}; bad entry: {exc!r}") from exc


def _choice(entry: dict) -> TuneChoice:
    if entry["mover"] not in _MOVERS:
        raise ValueError(f"unknown mover {entry['mover']!r}")
    fields = ("mover", "ctas", "vec", "store_gbps", "load_gbps")
    return TuneChoice(**{k: entry[k] for k in fields if k in entry})


def lookup(path: str | Path, key: str) -> TuneChoice | None:
    """The entry for ``key``, or None if the file or the key is absent."""
    return read_cache(path).get(key)


def write_choice(path: str | Path, key: str, choice: TuneChoice) -> None:
    """Add or replace one entry, keeping the others; atomic on POSIX file systems."""
    path = Path(path)
    entries = read_cache(path)
    entries[key] = choice
    payload = {
        "version": VERSION,
        "entries": {k: asdict(v) for k, v in sorted(entries.items())},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
