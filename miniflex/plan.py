"""The whole contract between the scheduler side and the workers: frozen dataclasses.

The scheduler decides *which* chunk goes *where*; a worker only executes. One
plan drives every TP rank, because every rank has the same slot geometry and
moves its own shard of each block.

Example: load chunk in CPU slot 7 into vLLM blocks 40..43 of request "r1"::

    TransferJob(job_id=JobId(3), req_id="r1", kind=JobKind.LOAD,
                chunks=(ChunkMove(slot=SlotId(7), block_ids=(40, 41, 42, 43)),))
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NewType

from miniflex.types import BlockId, ChunkKey, ReqId, SlotId

__all__ = [
    "ChunkMove",
    "JobId",
    "JobKind",
    "JobResult",
    "LoadProbe",
    "LoadTiming",
    "PutOutcome",
    "RemoteCopy",
    "SlotCopy",
    "TransferJob",
    "TransferPlan",
]

JobId = NewType("JobId", int)


class JobKind(enum.Enum):
    LOAD = "load"  # (SSD slot -> CPU or staging slot, then) that slot -> vLLM blocks
    STORE = "store"  # vLLM blocks -> CPU slot
    DEMOTE = "demote"  # CPU slot -> SSD slot
    CLEAR = "clear"  # forget every chunk of the SSD store (a cache reset)


class LoadTiming(enum.Enum):
    """When a LOAD job runs relative to the forward of its request.

    * ``ASYNC``: on the worker's gpu-load lane; vLLM keeps the request
      waiting until the worker reports it in ``finished_recving``, and computes
      it in a later step.
    * ``SYNC``: issued on vLLM's thread before the step's forward, which waits
      for every layer before its first attention layer (load-then-compute).
    * ``LAYERWISE``: issued the same way, but each attention layer waits only
      for its own layer's copy, so layer ``l + 1`` copies while ``l`` computes.

    SYNC and LAYERWISE jobs only read CPU slots (no promotions) and are never
    reported in ``finished_recving``: vLLM scheduled their request already.
    """

    ASYNC = "async"
    SYNC = "sync"
    LAYERWISE = "layerwise"


@dataclass(frozen=True)
class SlotCopy:
    """One chunk copied between the CPU pool and the SSD store.

    In a LOAD job it is a promotion (read SSD slot ``ssd`` into CPU slot
    ``cpu`` before the GPU copy); in a DEMOTE job a write of CPU slot ``cpu``
    to SSD slot ``ssd``. ``key`` is journaled with the bytes on SSD.
    """

    key: ChunkKey
    cpu: SlotId
    ssd: SlotId


@dataclass(frozen=True)
class RemoteCopy:
    """One chunk copied between CPU slot ``cpu`` and the remote store (``remote_url``).

    In a LOAD job a fetch (the store's value of ``key`` read into the slot before
    the GPU copy); in a STORE job a put (the slot's bytes written to the store
    after the GPU->CPU copy, asynchronously: the job's result never waits for it).
    Each rank reads and writes its own shard's namespace.
    """

    key: ChunkKey
    cpu: SlotId


@dataclass(frozen=True)
class ChunkMove:
    """One chunk: a tier slot and the vLLM blocks it maps to, in token order.

    ``block_ids[i]`` holds block ``first + i`` of the chunk. Stores always move
    whole chunks (``first == 0``); a load may start inside a chunk (the blocks
    before ``first`` are already on the GPU) or end early (the prompt's last
    token is always computed by vLLM).
    """

    slot: SlotId
    block_ids: tuple[BlockId, ...]
    first: int = 0


@dataclass(frozen=True)
class TransferJob:
    """All chunks of one request moved in one direction in one engine step."""

    job_id: JobId
    req_id: ReqId | None
    """None: a job of no request (DEMOTE, CLEAR)."""
    kind: JobKind
    chunks: tuple[ChunkMove, ...]
    unavailable: tuple[BlockId, ...] = ()
    """Blocks promised to vLLM whose chunk vanished before the load: reported as load errors."""
    promotions: tuple[SlotCopy, ...] = ()
    """LOAD: SSD reads into CPU slots, done before the GPU copy."""
    demotions: tuple[SlotCopy, ...] = ()
    """DEMOTE: the writes of CPU slots to SSD."""
    timing: LoadTiming = LoadTiming.ASYNC
    """LOAD: when it runs (see :class:`LoadTiming`); other kinds are always ASYNC."""
    remote: tuple[RemoteCopy, ...] = ()
    """LOAD: fetches from the remote store, done first (with the promotions); STORE, DEMOTE:
    puts after (see :attr:`puts`)."""
    streams: tuple[SlotCopy | RemoteCopy, ...] = ()
    """LOAD: SSD reads (:class:`SlotCopy`) and remote fetches (:class:`RemoteCopy`) into the
    worker's staging slots (``cpu``: slot numbers past the CPU tier's, reused in turn),
    after the reads into CPU slots; each chunk's GPU copy starts as soon as its window has
    arrived, and its staging slot is read into again only once that copy is done.
    ``streams[i]`` is the chunk of the ``i``-th :class:`ChunkMove` whose slot is a staging
    slot, in token order (SSD chunks first: a load's remote chunks follow its local run)."""

    @property
    def reads(self) -> tuple[SlotCopy | RemoteCopy, ...]:
        """LOAD: the chunks read into CPU slots before the GPU copy (SSD and remote)."""
        if self.kind is not JobKind.LOAD:
            return ()
        return (*self.promotions, *self.remote)

    @property
    def puts(self) -> tuple[RemoteCopy, ...]:
        """STORE (write-through) and DEMOTE (write-back): the chunks put to the remote store."""
        return self.remote if self.kind in (JobKind.STORE, JobKind.DEMOTE) else ()

    @property
    def touches_ssd(self) -> bool:
        """Whether the job reads from SSD (promotions, streams) or writes to it (demotions)."""
        return bool(self.promotions or self.demotions or self.ssd_streams)

    @property
    def ssd_streams(self) -> tuple[SlotCopy, ...]:
        """LOAD: the streams read from SSD (the others are fetched from the remote store)."""
        return tuple(c for c in self.streams if isinstance(c, SlotCopy))

    @property
    def synchronous(self) -> bool:
        """A LOAD that vLLM's step waits for in its forward (SYNC or LAYERWISE)."""
        return self.timing is not LoadTiming.ASYNC

    @property
    def block_ids(self) -> tuple[BlockId, ...]:
        return tuple(b for c in self.chunks for b in c.block_ids)


@dataclass(frozen=True)
class TransferPlan:
    """What the scheduler sends the workers for one step.

    ``release`` lists requests that vLLM has finished and whose blocks MiniFlex
    holds until their stores complete; a worker reports each of them as
    finished-sending once it has no store job of theirs left.
    """

    jobs: tuple[TransferJob, ...] = ()
    release: tuple[ReqId, ...] = ()
    preempted: tuple[ReqId, ...] = ()
    """Requests whose blocks vLLM freed this step: their stores must finish before compute."""
    step: int = 0
    """The engine step this plan belongs to (workers report its forward time by it)."""
    full_graph: bool = False
    """The step may replay a full CUDA graph, which skips ``wait_for_layer_load``: a worker
    orders the forward after the step's in-step loads before it starts
    (:mod:`miniflex.scheduler.cuda_graphs`)."""
    timed: bool = True
    """The workers time this step's forward for the cost model (most decode steps are not
    timed: :data:`miniflex.scheduler.advisor.DECODE_TIMED_EVERY`)."""
    forward: bool = True
    """The step computes tokens. False: vLLM runs no forward, and some versions skip the
    hooks around it; a worker queues the plan's stores (of finished requests' blocks,
    computed in earlier steps) when it reports what finished."""


@dataclass(frozen=True)
class JobResult:
    """A worker's report of one finished job (``ok=False`` means nothing usable was moved)."""

    job_id: JobId
    req_id: ReqId | None  # the job's
    kind: JobKind
    ok: bool
    num_bytes: int = 0
    seconds: float = 0.0
    failed_block_ids: tuple[BlockId, ...] = field(default=())
    """LOAD: blocks not loaded (vLLM recomputes them), whether or not ``ok``."""
    failed_keys: tuple[ChunkKey, ...] = field(default=())
    """Chunks whose SSD read (LOAD) or write (DEMOTE) failed: corrupt, unreadable or disk full."""
    io: str = ""
    """The SSD I/O backend (``io_uring``, ``threads``) if the job touched SSD."""
    ssd_seconds: float = 0.0
    """LOAD: the part of ``seconds`` spent reading from SSD (promotions and streams: a
    streamed load's ``seconds`` is its reads plus its copies, as if they had not overlapped)."""
    remote_seconds: float = 0.0
    """LOAD: the part of ``seconds`` spent fetching chunks from the remote store."""
    wall_seconds: float = 0.0
    """From the job's plan reaching the worker to its report: ``seconds``, and any wait
    before it (its slots' background readers, write-backs and put copies; its lanes busy
    with earlier jobs). 0: not measured (a load inside the step)."""
    wait_seconds: float = 0.0
    """The part of ``wall_seconds`` before a lane first started the job: its wait for the
    background readers of the slots it writes (put copies, write-backs) and for its lane
    (a load whose streamed chunks went ahead of its reads: the longer wait of the two
    parts). 0: not measured."""

    @property
    def copy_seconds(self) -> float:
        """LOAD: the part of ``seconds`` spent copying (neither reading SSD nor fetching)."""
        return self.seconds - self.ssd_seconds - self.remote_seconds


@dataclass(frozen=True)
class LoadProbe:
    """A worker's start-up measurement of its mover: the same chunks loaded both ways.

    ``load_seconds``: one :meth:`~miniflex.gpu.base.KVMover.load` call (the
    asynchronous path); ``layerwise_seconds``: one ``load_layerwise`` call until
    its last layer is in. The scheduler's cost model starts from these.
    """

    num_bytes: int
    load_seconds: float
    layerwise_seconds: float
    ssd_read_bps: float | None = None
    """Bytes/s this worker's SSD tier read chunks back at (:mod:`miniflex.ssd.read_probe`);
    None: no SSD tier, or the probe could not run."""
    remote_read_bps: float | None = None
    """Bytes/s this worker fetched chunks from the remote store at (:mod:`miniflex.remote.probe`);
    None: no remote tier, or the store could not be reached."""


@dataclass(frozen=True)
class PutOutcome:
    """What a worker's write-through puts came to since its last report (all ranks, once
    aggregated): chunks the store acknowledged, held already, refused or never reached,
    and dropped unsent (``remote_write_backlog`` was full); and seconds puts waited for
    the same rank's fetches (:mod:`miniflex.remote.fetch_gate`)."""

    acked: int = 0
    held: int = 0
    failed: int = 0
    dropped: int = 0
    wait_seconds: float = 0.0

    def __add__(self, other: PutOutcome) -> PutOutcome:
        return PutOutcome(
            self.acked + other.acked,
            self.held + other.held,
            self.failed + other.failed,
            self.dropped + other.dropped,
            self.wait_seconds + other.wait_seconds,
        )

    def __bool__(self) -> bool:
        return bool(self.acked or self.held or self.failed or self.dropped or self.wait_seconds)
