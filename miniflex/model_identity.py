"""The identity of the model whose KV a chunk holds, beyond its shape.

Two engines may share a chunk's bytes only if they would have computed the
same bytes. The shapes (layers, heads, head size, dtype, block and chunk size,
page order, TP geometry) are fields of :class:`~miniflex.keys.Namespace`
already; this module adds what else changes K and V without changing a shape:

- **the model's configuration**: its ``config.json`` as parsed (``rope_theta``,
  ``rope_scaling``, ``partial_rotary_factor``, norms, activations, and every
  other field), leaving out only bookkeeping keys (those starting with ``_``,
  ``transformers_version``); for a Hugging Face repo id, the cached one;
- **the weights**: for a local directory, each weight file's name, size and
  bytes (whole files up to :data:`WHOLE_FILE_BYTES`; of larger ones the first
  and last MiB and :data:`WINDOWS` windows spread over the rest, which no
  re-trained or re-quantized checkpoint of the same shapes leaves alike); for
  a repo id, the snapshot (commit) its cached ``config.json`` lies in, and the
  revision asked for;
- **vLLM's settings that rewrite the configuration or the cache**:
  ``hf_overrides``, RoPE given on the command line, ``kv_cache_dtype``.

:func:`model_identity` hashes them into a hex digest. It reads the files
again in each process that asks (the scheduler and every worker compute the
same digest from the same files) and caches the answer per process until a
file's size or modification time changes. Nothing here imports vLLM.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "WEIGHT_SUFFIXES",
    "WHOLE_FILE_BYTES",
    "WINDOWS",
    "adapter_identity",
    "config_identity",
    "hub_cached_config",
    "model_identity",
]

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
WHOLE_FILE_BYTES = 8 << 20
"""Weight files up to this size are hashed whole."""
WINDOWS = 64
"""Windows of :data:`WINDOW_BYTES` sampled from the inside of a larger weight file."""
WINDOW_BYTES = 64 << 10
_EDGE_BYTES = 1 << 20
_BOOKKEEPING = ("transformers_version",)


def model_identity(
    model: str, revision: str | None = None, settings: Mapping[str, object] | None = None
) -> str:
    """The hex digest of ``model``'s identity (see the module docstring).

    ``settings`` are vLLM's settings that change the KV (``hf_overrides``,
    ``rope_scaling``, ``kv_cache_dtype``, ...); values that JSON cannot hold are
    named by their type and qualified name, never by an address.
    """
    frozen = json.dumps(dict(settings or {}), sort_keys=True, default=_named)
    path = Path(model).expanduser()
    cached = None if path.exists() else hub_cached_config(model, revision)
    stamp = _stamp(path if cached is None else Path(cached), "config.json")
    return _identity(model, revision, frozen, cached, stamp, "config.json")


def adapter_identity(path: str) -> str:
    """The hex digest of a LoRA adapter's directory: its ``adapter_config.json`` (rank,
    alpha, target modules), its weight files' bytes as for a model, and the path. A path
    that is not here (a Hub repo id that vLLM downloads later) is named by itself alone."""
    local = Path(path).expanduser()
    stamp = _stamp(local, "adapter_config.json") if local.exists() else ()
    return _identity(path, None, f"adapter {path}", None, stamp, "adapter_config.json")


def _stamp(path: Path, config_file: str) -> tuple[tuple[str, int, int], ...]:
    """Name, size and mtime of the files hashed: a changed file is hashed again."""
    files = [path / config_file, *_weight_files(path)] if path.is_dir() else [path]
    out = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue
        out.append((f.name, st.st_size, st.st_mtime_ns))
    return tuple(out)


@functools.lru_cache(maxsize=64)
def _identity(
    model: str,
    revision: str | None,
    settings: str,
    cached: str | None,
    stamp: object,
    config_file: str,
) -> str:
    parts: dict[str, Any] = {"revision": revision, "settings": settings}
    path = Path(model).expanduser()
    if path.is_dir():
        parts["config"] = config_identity(path / config_file)
        parts["weights"] = [_file_digest(f) for f in _weight_files(path)]
    elif path.is_file():  # a single GGUF file
        parts["weights"] = [_file_digest(path)]
    else:
        parts["config"] = None if cached is None else config_identity(Path(cached))
        parts["snapshot"] = None if cached is None else Path(cached).parent.name
    text = json.dumps(parts, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def config_identity(path: Path) -> object:
    """A ``config.json`` as parsed, without its bookkeeping keys (None if absent)."""
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # unreadable: name it by its bytes where possible
        return f"unreadable: {type(exc).__name__}"
    return _without_bookkeeping(config)


def _without_bookkeeping(value: object) -> object:
    if isinstance(value, dict):
        return {
            k: _without_bookkeeping(v)
            for k, v in value.items()
            if not str(k).startswith("_") and k not in _BOOKKEEPING
        }
    if isinstance(value, list):
        return [_without_bookkeeping(v) for v in value]
    return value


def _weight_files(directory: Path) -> list[Path]:
    found = [p for p in directory.iterdir() if p.name.endswith(WEIGHT_SUFFIXES) and p.is_file()]
    return sorted(found)


def _file_digest(path: Path) -> list[object]:
    """``[name, size, digest of the sampled bytes]`` of one weight file."""
    size = path.stat().st_size
    h = hashlib.blake2b(digest_size=16)
    with path.open("rb") as f:
        for offset, length in _samples(size):
            f.seek(offset)
            h.update(f.read(length))
    return [path.name, size, h.hexdigest()]


def _samples(size: int) -> list[tuple[int, int]]:
    """The ``(offset, length)`` ranges of a file of ``size`` bytes that are hashed."""
    if size <= WHOLE_FILE_BYTES:
        return [(0, size)]
    inner = size - 2 * _EDGE_BYTES
    step = inner // (WINDOWS + 1)
    windows = [(_EDGE_BYTES + step * (i + 1), WINDOW_BYTES) for i in range(WINDOWS)]
    return [(0, _EDGE_BYTES), *windows, (size - _EDGE_BYTES, _EDGE_BYTES)]


def hub_cached_config(repo_id: str, revision: str | None = None) -> str | None:
    """The cached ``config.json`` of a Hugging Face repo, if this machine has one."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except ValueError:  # not a repo id
        return None
    return found if isinstance(found, str) and os.path.isfile(found) else None


def _named(value: object) -> str:
    """A JSON stand-in for a setting JSON cannot hold (a dtype, an enum, a callable): its
    text, or, where that holds an address, its type and qualified name."""
    text = str(value)
    if " at 0x" not in text:
        return text
    kind = type(value)
    name = getattr(value, "__qualname__", kind.__qualname__)
    return f"<{getattr(value, '__module__', kind.__module__)}.{name}>"
