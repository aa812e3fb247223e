"""The worker-side SSD chunk store: slot files on one or more disks plus a crash-safe journal.

The scheduler's ``SlotTier`` picks the slot; this store owns the bytes. Slot ``s``
lives in data file ``s % n`` at offset ``(s // n) * slot_bytes`` (striped over the
``n`` directories, each file preallocated and opened with ``O_DIRECT``); the
:class:`~miniflex.ssd.journal.SlotJournal` sits next to the first file.

Durability, per :meth:`SSDStore.write` batch::

    1. DEL_SLOT for every target slot that a replay could still map -> fdatasync journal
    2. all data writes in one backend.run -> fdatasync each data file written
    3. CRC32 per chunk, PUT records -> fdatasync journal -> return True per item

So after ``kill -9`` (or power loss) at any instant, every PUT in the journal
points at complete data, and an acknowledged write is recovered on reopen.
Checksums are CRC32 (``zlib.crc32``, which releases the GIL for large buffers);
they are verified lazily, by :meth:`read`.

Example::

    store = SSDStore(["/nvme0/mf", "/nvme1/mf"], 64 << 30, geometry.slot_bytes, ns.digest)
    seed = store.recovered()  # key -> slot, to seed the scheduler's SlotTier
    ok = store.write([(key, SlotId(7), memoryview(pool.slot(3)))])
    ok, _seconds = store.read([(key, SlotId(7), memoryview(pool.slot(4)))])
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType

from miniflex.errors import ConfigError, IOBackendError
from miniflex.layout import ALIGN
from miniflex.ssd.backends import make_backend
from miniflex.ssd.base import BackendError, IOBackend, IOOp
from miniflex.ssd.files import open_direct, slot_parts
from miniflex.ssd.journal import SlotJournal, read_journal
from miniflex.ssd.part_crcs import PartChecksums
from miniflex.types import ChunkKey, SlotId

__all__ = [
    "DATA_FILE",
    "JOURNAL_FILE",
    "SSDStore",
    "make_dirs",
    "rank_dirs",
    "read_slots",
    "slot_count",
]

log = logging.getLogger("miniflex.ssd")

DATA_FILE = "miniflex-slots.dat"
JOURNAL_FILE = "miniflex-slots.journal"
Item = tuple[ChunkKey, SlotId, memoryview]


def rank_dirs(dirs: Sequence[str], rank: int) -> list[str]:
    """The directories of TP rank ``rank``'s store: ``<dir>/rank<rank>`` for each of ``dirs``."""
    return [os.path.join(os.path.abspath(d), f"rank{rank}") for d in dirs]


def make_dirs(dirs: Sequence[str], key: str) -> list[str]:
    """Create the missing ones of ``dirs`` (mode 0700); returns those it created.

    An OS refusal (a read-only file system, no permission) is a ConfigError
    naming ``key``; the directories created before it are removed again.
    """
    made: list[str] = []
    try:
        for d in dirs:
            if not os.path.isdir(d):
                with contextlib.suppress(FileExistsError):  # another process made it just now
                    os.mkdir(d, 0o700)
                    made.append(d)
    except OSError as exc:
        for d in reversed(made):
            with contextlib.suppress(OSError):
                os.rmdir(d)
        why = f"cannot create it ({exc.strerror}); give a writable directory"
        raise ConfigError(key, d, why) from None
    return made


def slot_count(total_bytes: int, num_dirs: int, slot_bytes: int) -> int:
    """Slots of a store of ``total_bytes`` over ``num_dirs`` files (the same in every process)."""
    return total_bytes // num_dirs // slot_bytes * num_dirs


def read_slots(
    dirs: Sequence[str], total_bytes: int, slot_bytes: int, namespace_digest: bytes
) -> dict[ChunkKey, SlotId]:
    """The ``key -> slot`` map a store over ``dirs`` holds, read without opening the store.

    The scheduler seeds its SSD index with this after the worker has opened
    the store (which repairs the journal). Nothing is verified here; a corrupt
    chunk fails its checksum when it is read.
    """
    path = os.path.join(os.path.abspath(dirs[0]), JOURNAL_FILE)
    n = slot_count(total_bytes, len(dirs), slot_bytes)
    return {k: s for k, (s, _) in read_journal(path, namespace_digest, slot_bytes, n).items()}


class SSDStore:
    """Chunk bytes on SSD, one instance per worker process; thread-safe (calls serialize).

    Construction raises :class:`~miniflex.errors.ConfigError` for bad
    directories or a size below one slot per directory, and
    :class:`~miniflex.errors.IOBackendError` when a file system lacks the
    space or refuses ``O_DIRECT``. A second store on any of the same
    directories (another live process) is refused: every data file is locked. A failed
    construction removes the files it created. A journal written for another
    namespace digest, slot size or slot count is replaced by an empty one and
    the data files are truncated: nothing of the old model is ever read.
    """

    def __init__(
        self,
        dirs: Sequence[str],
        total_bytes: int,
        slot_bytes: int,
        namespace_digest: bytes,
        backend: IOBackend | None = None,
    ) -> None:
        _check_config(dirs, total_bytes, slot_bytes, namespace_digest)
        self.slot_bytes = slot_bytes
        self._paths = [os.path.join(os.path.abspath(d), DATA_FILE) for d in dirs]
        self._num_slots = slot_count(total_bytes, len(dirs), slot_bytes)
        file_slots = self._num_slots // len(dirs)
        self._mutex = threading.Lock()
        self._fds: list[int] = []
        self._lock_fds: list[int] = []
        self._journal: SlotJournal | None = None
        self._io: IOBackend | None = None
        jpath = os.path.join(os.path.dirname(self._paths[0]), JOURNAL_FILE)
        made = [p for p in (*self._paths, jpath) if not os.path.exists(p)]
        try:
            for path in self._paths:  # every file: two stores must never share one
                self._lock_fds.append(_lock(path))
            self._journal = SlotJournal(jpath, namespace_digest, slot_bytes, self._num_slots)
            if self._journal.reset_reason is not None:
                for path in self._paths:
                    if os.path.exists(path):
                        os.truncate(path, 0)
            for path in self._paths:
                self._fds.append(open_direct(path, file_slots * slot_bytes))
            self._owns_io = backend is None
            self._io = make_backend() if backend is None else backend
        except BaseException:
            self.close()
            for path in made:  # a refused start leaves nothing behind it created
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise
        n, found = self._num_slots, len(self._journal.live)
        log.info("SSD store: %d slots of %d B in %s; %d recovered", n, slot_bytes, dirs, found)

    @property
    def num_slots(self) -> int:
        return self._num_slots

    def location(self, slot: SlotId) -> tuple[str, int]:
        """``(data file path, byte offset)`` of ``slot``."""
        return self._paths[slot % len(self._paths)], slot // len(self._paths) * self.slot_bytes

    def recovered(self) -> dict[ChunkKey, SlotId]:
        """The live ``key -> slot`` map; right after construction, what the journal replay found.

        Called once by the worker at start-up to seed the scheduler's index.
        Slots are checked to be in range; data checksums are *not* verified
        here but lazily, by :meth:`read` (a corrupt chunk then fails its load
        and is dropped).
        """
        return {key: slot for key, (slot, _) in self._live_journal().live.items()}

    def write(self, items: Sequence[Item]) -> list[bool]:
        """Store each ``(key, slot, buf)``; ``True`` means durable and journaled.

        ``buf`` is exactly ``slot_bytes`` of 4 KiB-aligned memory (e.g. a
        HostPool row). Whatever lived in a target slot is forgotten first. A
        failed item (I/O error, ENOSPC, a journal that cannot grow) is
        ``False``, logged, never journaled; this never raises for I/O
        failures. Raises ``ValueError`` for a bad slot, length or a slot
        given twice.
        """
        with self._mutex:
            journal = self._live_journal()
            self._check_items(items, write=True)
            try:
                journal.delete_slots(slot for _, slot, _ in items)
            except OSError as exc:
                log.error("SSD store: cannot journal slot deletions, writing nothing: %s", exc)
                return [False] * len(items)
            ok = self._run([self._op(slot, buf, True) for _, slot, buf in items])
            self._sync_data(items, ok)
            puts = [
                (key, slot, zlib.crc32(buf))
                for (key, slot, buf), good in zip(items, ok, strict=True)
                if good
            ]
            try:
                journal.put(puts)
            except OSError as exc:
                log.error("SSD store: cannot journal %d written chunk(s): %s", len(puts), exc)
                return [False] * len(items)
            return ok

    def read(
        self,
        items: Sequence[Item],
        part_bytes: int = 0,
        on_part: Callable[[int], None] | None = None,
    ) -> tuple[list[bool], float]:
        """Read each ``(key, slot, buf)`` into ``buf`` and verify its checksum: ``(ok per
        item, seconds)``, the seconds once the read held the store (a write holding it is
        not counted).

        ``False`` for a key not journaled at that slot, an I/O error or a
        checksum mismatch; the latter two drop the key (journal DEL), so a
        corrupt chunk is never served. ``buf``'s content is unspecified then.

        ``part_bytes`` (a multiple of 4 KiB, 0: whole slots): read every slot in parts of
        that many bytes, part ``p`` of all items as one batch, the last part running to the
        slot's end, and call ``on_part(p)`` once each batch is in (its bytes not verified
        yet: the checksums are checked once every part is read).
        """
        with self._mutex:
            t0 = time.perf_counter()
            journal = self._live_journal()
            self._check_items(items, write=False)
            sums: dict[int, int] = {}  # item index -> journaled checksum
            for i, (key, slot, _) in enumerate(items):
                entry = journal.live.get(key)
                if entry is not None and entry[0] == slot:
                    sums[i] = entry[1]
            ran = [True] * len(sums)
            parts = slot_parts(self.slot_bytes, part_bytes)
            crcs = PartChecksums([items[i][2] for i in sums], threaded=len(parts) > 1)
            for p, (lo, hi) in enumerate(parts):
                got = self._run([self._op(items[i][1], items[i][2], False, lo, hi) for i in sums])
                ran = [a and b for a, b in zip(ran, got, strict=True)]
                crcs.add(lo, hi)  # beside the next part's reads
                if on_part is not None:
                    on_part(p)
            ok = [False] * len(items)
            for (i, crc), good, got_crc in zip(sums.items(), ran, crcs.result(), strict=True):
                ok[i] = good and got_crc == crc
                if good and not ok[i]:
                    log.error("SSD store: chunk %032x in slot %d fails its checksum", *items[i][:2])
            self._drop([items[i][0] for i in sums if not ok[i]])
            return ok, time.perf_counter() - t0

    def clear(self) -> None:
        """Forget every chunk durably (the journal is rewritten empty)."""
        with self._mutex:
            self._live_journal().compact_to({})

    @property
    def backend_name(self) -> str:
        """The I/O backend in use (``io_uring`` or ``threads``)."""
        assert self._io is not None
        return self._io.name

    def drop(self, keys: Iterable[ChunkKey]) -> None:
        """Forget ``keys`` durably (journal DEL); unknown keys are ignored; never raises OSError."""
        with self._mutex:
            self._drop(list(keys))

    def close(self) -> None:
        """Close files, journal and (if the store made it) the backend; idempotent."""
        with self._mutex:
            if self._journal is not None:
                self._journal.close()
                self._journal = None
            if self._io is not None and self._owns_io:
                self._io.close()
            self._io = None  # a caller's backend stays open
            for fd in [*self._fds, *self._lock_fds]:
                os.close(fd)
            self._fds, self._lock_fds = [], []

    def __enter__(self) -> SSDStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---- internals ----
    def _live_journal(self) -> SlotJournal:
        if self._journal is None:
            raise BackendError(errno.EBADF, "the SSD store is closed")
        return self._journal

    def _check_items(self, items: Sequence[Item], write: bool) -> None:
        slots = [slot for _, slot, _ in items]
        if write and len(set(slots)) != len(slots):
            raise ValueError(f"SSD store write names a slot twice: {sorted(slots)}")
        for _, slot, buf in items:
            if not 0 <= slot < self._num_slots:
                raise ValueError(f"slot {slot} is outside [0, {self._num_slots})")
            if memoryview(buf).nbytes != self.slot_bytes:
                raise ValueError(f"buffer of {memoryview(buf).nbytes} bytes, not {self.slot_bytes}")

    def _op(self, slot: SlotId, buf: memoryview, write: bool, lo: int = 0, hi: int = 0) -> IOOp:
        """The op on bytes ``[lo, hi)`` of the slot (``hi`` 0: to its end)."""
        path, offset = self.location(slot)
        view = memoryview(buf).cast("B")[lo : hi or None]
        return IOOp(self._fds[slot % len(self._fds)], path, offset + lo, view, write)

    def _run(self, ops: list[IOOp]) -> list[bool]:
        """Run ``ops`` as one batch; a failed op is ``False`` and the rest are retried."""
        assert self._io is not None
        ok, start = [True] * len(ops), 0
        while start < len(ops):
            rest = ops[start:]
            try:
                self._io.run(rest)
                break
            except IOBackendError as exc:
                log.error("SSD store: %s", exc)
                where = (exc.path, exc.offset)
                failed = next(
                    (j for j, op in enumerate(rest) if (op.path, op.offset) == where), None
                )
                if failed is None:  # not one of ours: trust none of the rest
                    ok[start:] = [False] * len(rest)
                    break
                ok[start + failed] = False
                start += failed + 1
            except BackendError as exc:
                log.error("SSD store: the I/O backend failed, %d op(s) lost: %s", len(rest), exc)
                ok[start:] = [False] * len(rest)
                break
        return ok

    def _sync_data(self, items: Sequence[Item], ok: list[bool]) -> None:
        """fdatasync each data file written to; a failure fails every item in that file."""
        n = len(self._paths)
        for f in sorted({slot % n for (_, slot, _), good in zip(items, ok, strict=True) if good}):
            try:
                os.fdatasync(self._fds[f])
            except OSError as exc:
                log.error("SSD store: fdatasync of %s failed: %s", self._paths[f], exc)
                for i, (_, slot, _) in enumerate(items):
                    if slot % n == f:
                        ok[i] = False

    def _drop(self, keys: list[ChunkKey]) -> None:
        if not keys:
            return
        try:
            self._live_journal().delete_keys(keys)
        except OSError as exc:
            log.error("SSD store: cannot journal dropping %d chunk(s): %s", len(keys), exc)


def _check_config(dirs: Sequence[str], total: int, slot_bytes: int, digest: bytes) -> None:
    if isinstance(dirs, str) or not dirs:
        raise ConfigError("ssd_dirs", dirs, "a non-empty list of directories")
    real = [os.path.realpath(d) for d in dirs]
    if len(set(real)) != len(real):
        raise ConfigError("ssd_dirs", list(dirs), "distinct directories (one file each)")
    for d in dirs:
        if not os.path.isdir(d) or not os.access(d, os.W_OK | os.X_OK):
            raise ConfigError("ssd_dirs", d, "an existing, writable directory")
    if slot_bytes <= 0 or slot_bytes % ALIGN:
        raise ConfigError("slot_bytes", slot_bytes, f"a positive multiple of {ALIGN}")
    if total < len(dirs) * slot_bytes:
        raise ConfigError("ssd_bytes", total, f"at least one {slot_bytes}-byte slot per directory")
    if len(digest) != 16:
        raise ConfigError("namespace_digest", digest, "16 bytes (Namespace.digest)")


def _lock(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            "ssd_dirs",
            os.path.dirname(path),
            "a live MiniFlex store uses it; give each server a directory of its own",
        ) from None
    return fd
