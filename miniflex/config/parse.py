"""Parsers of MiniFlex settings: each turns a raw value (a string from the environment, or
a value from ``kv_connector_extra_config``) into a typed one, or raises ConfigError naming the
key, the value and what would be accepted."""

from __future__ import annotations

import os
import re

from miniflex.errors import ConfigError

__all__ = [
    "parse_auto_float",
    "parse_auto_size",
    "parse_bool",
    "parse_choice",
    "parse_chunk_blocks",
    "parse_dirs",
    "parse_int",
    "parse_path",
    "parse_seconds",
    "parse_size",
]

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


def parse_int(key: str, value: object, lo: int, hi: int) -> int:
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


def parse_chunk_blocks(key: str, value: object) -> int | None:
    if value is None or value == "auto":
        return None
    try:
        return parse_int(key, value, 1, 1024)
    except ConfigError:
        raise ConfigError(key, value, "expected 'auto' or an integer from 1 to 1024") from None


def parse_choice(key: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value.lower() not in choices:
        raise ConfigError(key, value, "expected one of " + ", ".join(repr(c) for c in choices))
    return value.lower()


def parse_bool(key: str, value: object) -> bool:
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


def parse_path(key: str, value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(key, value, "expected a file path")
    parent = os.path.dirname(os.path.abspath(value))
    if not os.path.isdir(parent):
        raise ConfigError(key, value, f"the directory {parent} must exist")
    return value


def parse_dirs(key: str, value: object) -> tuple[str, ...]:
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


def parse_auto_size(key: str, value: object) -> int | None:
    """``auto`` (None: derived) or a size."""
    return None if value is None or value == "auto" else parse_size(key, value)


def parse_auto_float(key: str, value: object) -> float | None:
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


def parse_seconds(key: str, value: object, lo: float, hi: float) -> float:
    """A duration in seconds from ``lo`` to ``hi`` (a number or a numeric string)."""
    try:
        x = float(value) if isinstance(value, (int, float, str)) and value is not True else None
    except ValueError:
        x = None
    if x is None or not lo <= x <= hi:
        raise ConfigError(key, value, f"expected seconds from {lo} to {hi}")
    return x
