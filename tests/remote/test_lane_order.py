"""A load's remote fetches run on a lane of their own: a store that stalls mid-fetch holds
up neither another request's SSD reads nor any GPU copy (streamed through staging slots
or not), a load with both is copied only once both are read, and a load's streamed chunks
never wait for the slots its promotions write into."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("redis")

from miniflex.config import MiniFlexConfig
from miniflex.plan import ChunkMove, JobId, JobKind, RemoteCopy, SlotCopy, TransferJob
from miniflex.ranks import RankSetup
from miniflex.remote.fetch import RemoteFetcher
from miniflex.remote.local_server import LocalServer
from miniflex.remote.tier import WorkerRemote
from miniflex.types import BlockId, ChunkKey, ReqId, SlotId
from miniflex.worker.handler import MiniFlexHandler
from tests.handler_steps import run_plan, wait_until
from tests.remote.conftest import NEEDS_SERVER, NS_A, payload, store
from tests.remote.test_put_copies import gated_copies

pytestmark = NEEDS_SERVER

BLOCKS = 8
ON_SSD, REMOTE = ChunkKey(21), ChunkKey(22)


@pytest.fixture
def kv() -> dict[str, torch.Tensor]:
    """vLLM's KV cache: 2 layers of ``BLOCKS`` pages of 4 KiB (a chunk is one block)."""
    return {f"layer.{i}": torch.randn(BLOCKS, 1, 16, 128).to(torch.float16) for i in range(2)}


def block_bytes(kv: dict[str, torch.Tensor], block: int) -> bytes:
    """Block ``block``'s pages, layer after layer: a chunk's bytes as a slot holds them."""
    return b"".join(t[block].contiguous().view(torch.uint8).numpy().tobytes() for t in kv.values())


@pytest.fixture
def handler(
    server: LocalServer, direct_dir: Path, kv: dict[str, torch.Tensor]
) -> Iterator[MiniFlexHandler]:
    config = MiniFlexConfig(mover="cpu", ssd_dirs=(str(direct_dir),), ssd_bytes=1 << 20)
    remote = WorkerRemote(store(server.url, NS_A), write_backlog=1 << 30)
    h = MiniFlexHandler(config, remote)
    h.register(kv, num_slots=4, blocks_per_chunk=1, setup=RankSetup(shard_digest=b"\x02" * 16))
    yield h
    h.shutdown()


def gated_fetches(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Hold every remote fetch (a store stalled mid-reply) until the returned event is set."""
    gate = threading.Event()
    real = RemoteFetcher.fetch

    def stalled(self: RemoteFetcher, copies: tuple[RemoteCopy, ...], *rest: object) -> object:
        assert gate.wait(10), "the test never opened the gate"
        return real(self, copies, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(RemoteFetcher, "fetch", stalled)
    return gate


def on_ssd_and_remote(h: MiniFlexHandler) -> tuple[bytes, bytes]:
    """Block 0's bytes written back to SSD as ``ON_SSD`` (via slot 0); another engine's
    chunk put to the store as ``REMOTE``. Returns both chunks' bytes."""
    assert h._pool is not None and h._remote is not None
    block0 = (ChunkMove(SlotId(0), (BlockId(0),)),)
    run_plan(h, 1, TransferJob(JobId(0), ReqId("a"), JobKind.STORE, block0))
    h.drain()
    demote = TransferJob(
        JobId(1), None, JobKind.DEMOTE, (), demotions=(SlotCopy(ON_SSD, SlotId(0), 0),)
    )
    run_plan(h, 2, demote)
    h.drain()
    remote_bytes = payload(h._pool.slot_bytes, seed=REMOTE)
    assert h._remote.store.put(REMOTE, remote_bytes)
    return h._pool.slot(SlotId(0)).tobytes(), remote_bytes


def load(i: int, req: str, block: int, slot: int, **reads: object) -> TransferJob:
    chunk = ChunkMove(SlotId(slot), (BlockId(block),))
    return TransferJob(JobId(i), ReqId(req), JobKind.LOAD, (chunk,), **reads)  # type: ignore[arg-type]


def test_a_stalled_fetch_holds_up_neither_another_loads_ssd_read_nor_a_cpu_hit(
    handler: MiniFlexHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = handler
    ssd_bytes, remote_bytes = on_ssd_and_remote(h)
    gate = gated_fetches(monkeypatch)
    try:
        fetched = load(2, "b", block=4, slot=1, remote=(RemoteCopy(REMOTE, SlotId(1)),))
        promoted = load(3, "c", block=5, slot=2, promotions=(SlotCopy(ON_SSD, SlotId(2), 0),))
        cpu_hit = load(4, "d", block=6, slot=0)
        run_plan(h, 3, fetched, promoted, cpu_hit)
        wait_until(lambda: not h.in_flight(ReqId("c")) and not h.in_flight(ReqId("d")), "loads")
        assert h.in_flight(ReqId("b")) == 1, "the stalled fetch's load finished"
        assert h._pool is not None and h._pool.slot(SlotId(2)).tobytes() == ssd_bytes
    finally:
        gate.set()
    h.drain()
    assert h._pool.slot(SlotId(1)).tobytes() == remote_bytes
    h.poll()
    results = {r.job_id: r for r in h.take_results()}
    assert all(results[JobId(i)].ok and not results[JobId(i)].failed_keys for i in (2, 3, 4))
    assert results[JobId(2)].remote_seconds > 0 and results[JobId(3)].ssd_seconds > 0


def test_a_load_with_fetches_and_ssd_reads_is_copied_once_both_are_read(
    handler: MiniFlexHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = handler
    ssd_bytes, remote_bytes = on_ssd_and_remote(h)
    copies: list[int] = []
    real_load = h._mover.load  # type: ignore[union-attr]

    def counted(chunks: tuple[ChunkMove, ...], after: object = None) -> int:
        assert h._pool is not None
        got = (h._pool.slot(SlotId(1)).tobytes(), h._pool.slot(SlotId(2)).tobytes())
        assert got == (remote_bytes, ssd_bytes), "copied before both reads were done"
        copies.append(len(chunks))
        return real_load(chunks, after=after)

    monkeypatch.setattr(h._mover, "load", counted)
    both = TransferJob(
        JobId(2),
        ReqId("b"),
        JobKind.LOAD,
        (ChunkMove(SlotId(1), (BlockId(4),)), ChunkMove(SlotId(2), (BlockId(5),))),
        promotions=(SlotCopy(ON_SSD, SlotId(2), 0),),
        remote=(RemoteCopy(REMOTE, SlotId(1)),),
    )
    run_plan(h, 3, both)
    h.drain()
    h.poll()
    (res,) = [r for r in h.take_results() if r.job_id == JobId(2)]
    assert res.ok and not res.failed_block_ids and copies == [2]
    assert res.ssd_seconds > 0 and res.remote_seconds > 0


def test_a_load_from_the_store_alone_copies_chunks_while_later_ones_still_arrive(
    handler: MiniFlexHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four chunks fetched from the store into CPU slots, the store stalled after the
    second: the first two are already copied to vLLM's blocks (one copy each: a group of
    one for a load this short) while the rest wait; once they arrive the load reports all
    four, bit for bit in the slots."""
    h = handler
    assert h._pool is not None and h._remote is not None
    keys = [ChunkKey(40 + i) for i in range(4)]
    data = [payload(h._pool.slot_bytes, seed=int(k)) for k in keys]
    for k, d in zip(keys, data, strict=True):
        assert h._remote.store.put(k, d)
    gate = threading.Event()
    real_get = type(h._remote.store).get_many_into

    def stalls_after_two(store: object, items: object, done: object = None) -> object:
        def told(i: int, n: int | None) -> None:
            if i == 2:
                assert gate.wait(10), "the test never opened the gate"
            done(i, n)  # type: ignore[operator]

        return real_get(store, items, told if done is not None else None)  # type: ignore[arg-type]

    monkeypatch.setattr(type(h._remote.store), "get_many_into", stalls_after_two)
    copied: list[tuple[int, ...]] = []
    real_load = h._mover.load  # type: ignore[union-attr]

    def spy(chunks: tuple[ChunkMove, ...], after: object = None) -> int:
        copied.append(tuple(c.slot for c in chunks))
        return real_load(chunks, after=after)

    monkeypatch.setattr(h._mover, "load", spy)
    moves = tuple(ChunkMove(SlotId(i), (BlockId(i),)) for i in range(4))
    fetches = tuple(RemoteCopy(k, SlotId(i)) for i, k in enumerate(keys))
    try:
        run_plan(h, 3, TransferJob(JobId(5), ReqId("r"), JobKind.LOAD, moves, remote=fetches))
        wait_until(lambda: sorted(s for c in copied for s in c) == [0, 1], "the first copies")
        assert h.in_flight(ReqId("r")) == 1
    finally:
        gate.set()
    h.drain()
    h.poll()
    (res,) = [r for r in h.take_results() if r.job_id == JobId(5)]
    assert res.ok and not res.failed_block_ids and res.remote_seconds > 0
    assert sorted(s for c in copied for s in c) == [0, 1, 2, 3]
    assert [h._pool.slot(SlotId(i)).tobytes() for i in range(4)] == data


def test_a_streamed_load_whose_store_stalls_holds_up_no_other_ssd_read(
    handler: MiniFlexHandler, kv: dict[str, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load streamed past the CPU tier, one chunk from SSD and then one from the store
    (staging slots 4 and 5): with the store stalled, another request's SSD read and its
    copy still finish; once the store answers, the streamed load reports both chunks, bit
    for bit in vLLM's blocks."""
    h = handler
    ssd_bytes, remote_bytes = on_ssd_and_remote(h)
    assert h._reads.streamer.window >= 2  # both streams would fit one window
    gate = gated_fetches(monkeypatch)
    streamed = TransferJob(
        JobId(2),
        ReqId("b"),
        JobKind.LOAD,
        (ChunkMove(SlotId(4), (BlockId(4),)), ChunkMove(SlotId(5), (BlockId(5),))),
        streams=(SlotCopy(ON_SSD, SlotId(4), 0), RemoteCopy(REMOTE, SlotId(5))),
    )
    promoted = load(3, "c", block=6, slot=2, promotions=(SlotCopy(ON_SSD, SlotId(2), 0),))
    try:
        run_plan(h, 3, streamed)
        run_plan(h, 4, promoted)
        wait_until(lambda: not h.in_flight(ReqId("c")), "the other request's SSD read")
        assert h.in_flight(ReqId("b")) == 1, "the stalled fetch's load finished"
    finally:
        gate.set()
    h.drain()
    h.poll()
    results = {r.job_id: r for r in h.take_results()}
    res = results[JobId(2)]
    assert res.ok and not res.failed_block_ids and not res.failed_keys
    assert res.ssd_seconds > 0 and res.remote_seconds > 0
    assert results[JobId(3)].ok
    assert block_bytes(kv, 4) == block_bytes(kv, 6) == ssd_bytes
    assert block_bytes(kv, 5) == remote_bytes


def test_a_loads_streamed_chunks_do_not_wait_for_the_put_copy_of_the_slot_it_promotes_into(
    handler: MiniFlexHandler, kv: dict[str, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load promotes one chunk into slot 1, whose last store's put copy is held, and
    streams two more (staging slots 4 and 5, one from SSD, one from the store): the streamed
    chunks reach vLLM's blocks while the copy is held; the promotion waits for it, so the
    put gets slot 1's stored bytes; the load then reports all three chunks as one result."""
    h = handler
    ssd_bytes, remote_bytes = on_ssd_and_remote(h)
    gate, seen = gated_copies(monkeypatch)
    stored = TransferJob(
        JobId(2),
        ReqId("s"),
        JobKind.STORE,
        (ChunkMove(SlotId(1), (BlockId(1),)),),
        remote=(RemoteCopy(ChunkKey(1001), SlotId(1)),),
    )
    both = TransferJob(
        JobId(3),
        ReqId("b"),
        JobKind.LOAD,
        tuple(ChunkMove(SlotId(s), (BlockId(b),)) for s, b in ((1, 6), (4, 4), (5, 5))),
        promotions=(SlotCopy(ON_SSD, SlotId(1), 0),),
        streams=(SlotCopy(ON_SSD, SlotId(4), 0), RemoteCopy(REMOTE, SlotId(5))),
    )
    block1 = block_bytes(kv, 1)
    try:
        run_plan(h, 3, stored)
        run_plan(h, 4, both)
        t0 = time.perf_counter()
        wait_until(
            lambda: block_bytes(kv, 4) == ssd_bytes and block_bytes(kv, 5) == remote_bytes,
            "the streamed chunks, while slot 1's put copy is held",
            timeout=5,  # within the held copy's own 10 s, so that a failure ends cleanly
        )
        assert h.in_flight(ReqId("b")) == 1 and block_bytes(kv, 6) != ssd_bytes
        time.sleep(0.2)
        held_s = time.perf_counter() - t0
    finally:
        gate.set()
    h.drain()
    h.poll()
    res = {r.job_id: r for r in h.take_results()}[JobId(3)]
    assert res.ok and not res.failed_block_ids and not res.failed_keys
    assert res.ssd_seconds > 0 and res.remote_seconds > 0
    assert res.num_bytes == 3 * len(ssd_bytes)
    assert held_s <= res.wait_seconds <= res.wall_seconds  # the promotion's wait for slot 1
    assert block_bytes(kv, 6) == ssd_bytes
    assert seen == [block1], "slot 1 was promoted into before its put copy"
