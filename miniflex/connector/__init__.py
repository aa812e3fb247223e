"""vLLM integration: ``MiniFlexConnector`` (the only package that imports vLLM).

vLLM loads the connector by ``kv_connector_module_path`` (``miniflex.connector``)
and takes ``MiniFlexConnector`` (or ``MiniFlexHMAConnector``, which keeps vLLM's
hybrid KV cache manager on) from this package; the class, and vLLM with it,
is imported on that first access, so ``miniflex serve`` and its pre-start checks
run without importing vLLM.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MiniFlexConnector", "MiniFlexHMAConnector"]


def __getattr__(name: str) -> Any:
    if name == "MiniFlexConnector":
        from miniflex.connector.connector import MiniFlexConnector

        return MiniFlexConnector
    if name == "MiniFlexHMAConnector":
        from miniflex.connector.hma import MiniFlexHMAConnector

        return MiniFlexHMAConnector
    raise AttributeError(f"module 'miniflex.connector' has no attribute {name!r}")
