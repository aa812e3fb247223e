"""``MiniFlexHMAConnector``: MiniFlex as a ``SupportsHMA`` connector (opt-in).

vLLM keeps its hybrid KV cache manager only for a connector class that is a
``SupportsHMA``; for any other (``MiniFlexConnector``) it turns the manager off
and puts every layer in one KV cache group, promoting sliding-window layers to
full attention (and keeping every block of them). Load this class instead to
keep the manager::

    --kv-transfer-config '{"kv_connector": "MiniFlexHMAConnector",
                           "kv_connector_module_path": "miniflex.connector", ...}'

* A model whose layers form one KV cache group (full attention, MLA) is served
  as ``MiniFlexConnector`` serves it; vLLM calls
  :meth:`request_finished_all_groups` instead of ``request_finished``.
* A model of full-attention and sliding-window groups (Gemma 3, gpt-oss) gets a
  :class:`~miniflex.connector.hma_groups.MiniFlexGroupsConnector`: one MiniFlex
  per group, a sliding-window group storing and loading only its windows.
* Mamba/linear-attention models are refused by both classes.

On a vLLM without ``SupportsHMA`` this class is ``MiniFlexConnector`` under
another name: vLLM turns the manager off as it does for any connector.
"""

from __future__ import annotations

from typing import Any

from miniflex.connector import compat
from miniflex.connector.connector import MiniFlexConnector
from miniflex.connector.hma_groups import MiniFlexGroupsConnector, serves_groups

__all__ = ["MiniFlexHMAConnector"]

_HMA = compat.hma_base()
_BASES: tuple[type, ...] = (MiniFlexConnector,) if _HMA is None else (MiniFlexConnector, _HMA)


class MiniFlexHMAConnector(*_BASES):  # type: ignore[misc]
    """MiniFlex with vLLM's hybrid KV cache manager kept on (see the module docstring)."""

    def __new__(cls, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> Any:
        """A model of several full-attention and sliding-window groups gets a
        :class:`MiniFlexGroupsConnector` (one MiniFlex per group) instead."""
        if _HMA is not None and serves_groups(kv_cache_config):
            return MiniFlexGroupsConnector(vllm_config, role, kv_cache_config)
        return super().__new__(cls)

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict | None]:
        """vLLM (``SupportsHMA``), once per finished or aborted request, before it frees
        the blocks of any group: True keeps every group's blocks until the request is
        reported in ``finished_sending`` (its stores are done); the dict is the request's
        ``kv_transfer_params``. MiniFlex serves one group (more are refused when the
        connector is built), so this is ``request_finished`` on that group's blocks."""
        groups = compat.group_block_ids(block_ids)
        assert len(groups) == 1, f"{len(groups)} KV cache groups: refused at start-up"
        return self.request_finished(request, groups[0])
