"""One finished request as the benchmarks see it, and the statistics over many.

Hit accounting, per request:

* ``cached_tokens``: vLLM's ``num_cached_tokens``, every prompt token that was
  not recomputed (vLLM's own GPU prefix cache plus what a KV connector loaded);
* ``external_tokens``: the part a KV connector loaded (MiniFlex reports it in
  ``kv_transfer_params``; for vLLM's native connector it is the change of the
  ``vllm:external_prefix_cache_hits`` counter around a request sent alone);
* ``vllm_hit_tokens``: the difference, vLLM's own prefix-cache hit.

``None`` means "not known for this engine or mode", never zero.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Sample", "load_seconds", "mean", "percentile", "resident_tokens", "tier_tokens"]

_TIER_KEY = re.compile(r"^(?:hit_tokens_(\w+)|(\w+)_hit_tokens)$")
_RESIDENT_KEY = re.compile(r"^resident_tokens_(\w+)$")


@dataclass(frozen=True)
class Sample:
    """One request: when it was sent, its first-token time, and where its KV came from."""

    label: str  # request class ("cold", "long", "short", ...)
    prompt_tokens: int
    ttft_ms: float  # from the (scheduled) arrival to the first output token
    e2e_ms: float
    output_tokens: int = 1
    arrival_s: float = 0.0  # open loop: scheduled arrival after the run's start
    cached_tokens: int | None = None
    external_tokens: int | None = None
    tiers: Mapping[str, int] = field(default_factory=dict)  # MiniFlex hits per tier
    first_token: int | None = None
    load: str | None = None  # how MiniFlex loaded the hit (``load_mode``), where it says
    resident: Mapping[str, int] = field(default_factory=dict)  # MiniFlex: found, per tier
    load_s: Mapping[str, float] = field(default_factory=dict)  # MiniFlex's load: wall, parts

    @property
    def vllm_hit_tokens(self) -> int | None:
        if self.cached_tokens is None:
            return None
        return self.cached_tokens - (self.external_tokens or 0)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tiers"] = dict(self.tiers)
        d["resident"] = dict(self.resident)
        d["load_s"] = dict(self.load_s)
        d["vllm_hit_tokens"] = self.vllm_hit_tokens
        return d


def tier_tokens(params: Mapping[str, Any] | None) -> dict[str, int]:
    """Per-tier hit tokens from MiniFlex's ``kv_transfer_params["miniflex"]``.

    Accepts ``hit_tokens_<tier>`` (the connector stats' spelling) and
    ``<tier>_hit_tokens``; an empty dict when the connector reports only the total.
    """
    return _per_tier(params, _TIER_KEY)


def resident_tokens(params: Mapping[str, Any] | None) -> dict[str, int]:
    """Per-tier tokens MiniFlex's lookup found (``resident_tokens_<tier>``), loaded or not:
    the cost model may have chosen to recompute some of them."""
    return _per_tier(params, _RESIDENT_KEY)


def load_seconds(params: Mapping[str, Any] | None) -> dict[str, float]:
    """MiniFlex's last asynchronous load of the request (``load_<part>_s``): its ``wall``
    time at the worker and its ``ssd``, ``remote`` and ``copy`` parts; empty without one."""
    return {
        k[len("load_") : -len("_s")]: float(v)
        for k, v in (params or {}).items()
        if k.startswith("load_") and k.endswith("_s")
    }


def _per_tier(params: Mapping[str, Any] | None, pattern: re.Pattern[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, value in (params or {}).items():
        m = pattern.match(key)
        if m and isinstance(value, int):
            out[next(g for g in m.groups() if g)] = value
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (linear interpolation, as numpy's default), None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return round(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo), 1)


def mean(values: Iterable[float | None]) -> float | None:
    """Mean of the known values; None if none is known."""
    known = [v for v in values if v is not None]
    return None if not known else round(sum(known) / len(known), 1)
