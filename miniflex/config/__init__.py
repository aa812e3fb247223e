"""MiniFlex's configuration: one frozen :class:`MiniFlexConfig`, built once at the boundary.

- ``frozen.py``: the dataclass, its environment overrides and ``config_table()``;
- ``specs.py``: one spec per field (default, parser, doc line), the single source of
  ``docs/config.md``;
- ``parse.py``: the value parsers (sizes, seconds, integers) with readable errors;
- ``remote.py``: the remote store's URL forms and their settings.

Callers import the names below from this package; the remote store's clients read its URL
forms from ``remote.py``, and parsers that a tool reuses come from ``parse.py``.
"""

from __future__ import annotations

from miniflex.config.frozen import (
    ENV_PREFIX,
    MiniFlexConfig,
    config_table,
    default_tune_cache,
    hash_seed_set,
    parse_size,
    serve_environment,
    serve_settings,
    total_memory_bytes,
)

__all__ = [
    "ENV_PREFIX",
    "MiniFlexConfig",
    "config_table",
    "default_tune_cache",
    "hash_seed_set",
    "parse_size",
    "serve_environment",
    "serve_settings",
    "total_memory_bytes",
]
