"""The harness's movers: MiniFlex's real mover, made pausable and able to fail on request."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from miniflex.errors import TransferError
from miniflex.gpu.base import KVMover, LayerGate, LayerwiseLoad
from miniflex.plan import ChunkMove

POISON = -1234.0
"""What the blocks of a layerwise load hold until their layer is waited for."""


class DeferredLoad(LayerwiseLoad):
    """A layerwise load whose layer ``l`` lands in vLLM's blocks only at ``wait_layer(l)``
    (or ``wait()``), as if its copy were still in flight until then: a forward that reads
    a layer without waiting for it reads poison, never bytes that happen to be right."""

    def __init__(self, kv: list[torch.Tensor], blocks: list[int], nbytes: int, log: list) -> None:
        self._kv, self._blocks, self._nbytes, self._log = kv, blocks, nbytes, log
        self._loaded = [t[blocks].clone() for t in kv]
        self._pending = set(range(len(kv)))

    def wait_layer(self, layer: int) -> None:
        self._log.append(("wait", layer))
        if layer in self._pending:
            self._pending.discard(layer)
            self._kv[layer][self._blocks] = self._loaded[layer]

    def wait(self) -> int:
        for layer in sorted(self._pending):
            self._kv[layer][self._blocks] = self._loaded[layer]
        self._pending.clear()
        return self._nbytes


class GatedMover(KVMover):
    """Wraps the worker's two real movers (``inner`` loads, ``store_inner`` stores);
    clearing ``gate`` makes transfers wait so tests act mid-flight, ``store_gate`` only stores,
    ``fence_gate`` a wait for a fence (the forward before it still running).

    Its ``load_layerwise`` defers each layer's bytes until the layer is waited for
    (``DeferredLoad``); ``fail_layerwise`` makes the next one raise at issue, and
    ``fail_loads`` / ``fail_stores`` the next that many whole-job loads or stores.
    """

    def __init__(self, inner: KVMover, kv: dict[str, torch.Tensor], store_inner: KVMover) -> None:
        self.inner = inner
        self.store_inner = store_inner
        self.kv = list(kv.values())
        self.gate = threading.Event()
        self.gate.set()
        self.store_gate = threading.Event()
        self.store_gate.set()
        self.store_entered = threading.Event()  # set when a store reaches the gates
        self.fence_gate = threading.Event()  # cleared: the forward before a fence "runs on"
        self.fence_gate.set()
        self.fence_waited = threading.Event()  # set when a thread waits for a fence
        self.lock = threading.Lock()  # a torch mover's staging buffer is not shared-safe
        self.store_lock = threading.Lock()
        self.fail_layerwise = False
        self.fail_loads = 0
        self.fail_stores = 0
        self.calls = {"store": 0, "load": 0}
        self.log: list[tuple[str, int]] = []  # ("wait", layer) and the harness's ("read", layer)

    def store(self, chunks: Sequence[ChunkMove], after: object = None) -> int:
        self.store_entered.set()
        self.gate.wait()
        self.store_gate.wait()
        if self.fail_stores > 0:
            self.fail_stores -= 1
            raise TransferError("injected store failure")
        self.calls["store"] += 1
        with self.store_lock:
            return self.store_inner.store(chunks, after)

    def load(self, chunks: Sequence[ChunkMove], after: object = None) -> int:
        self.gate.wait()
        if self.fail_loads > 0:
            self.fail_loads -= 1
            raise TransferError("injected load failure")
        self.calls["load"] += 1
        with self.lock:
            return self.inner.load(chunks, after)

    def load_layerwise(
        self, chunks: Sequence[ChunkMove], after: object = None, gate: LayerGate | None = None
    ) -> LayerwiseLoad:
        if self.fail_layerwise:
            self.fail_layerwise = False
            raise TransferError("injected failure at issue")
        if gate is not None:  # chunks still being read from SSD: copy them once all are in
            gate.wait(gate.num_layers - 1)
        blocks = [b for c in chunks for b in c.block_ids]
        nbytes = self.load(chunks, after)
        deferred = DeferredLoad(self.kv, blocks, nbytes, self.log)
        for t in self.kv:
            t[blocks] = POISON  # not landed yet (and never what a block held before)
        return deferred

    def fence(self) -> object:
        return self.inner.fence()

    def wait_for(self, marker: object) -> None:
        self.fence_waited.set()
        self.fence_gate.wait()
        self.inner.wait_for(marker)
