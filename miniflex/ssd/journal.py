"""The SSD store's slot journal: an append-only, crash-safe ``key -> (slot, checksum)`` log.

File format (little endian, every record 48 bytes, each with its own CRC32)::

    header: magic "MFXJNL" | version u16 | namespace digest 16B | slot_bytes u64
            | num_slots u64 | crc32 u32 | 4 pad
    record: kind u8 | 3 pad | checksum u32 | key 16B | slot u64 | length u64 | crc32 u32 | 4 pad

``kind`` is PUT (key now lives in slot, its bytes have ``checksum``), DEL_KEY or
DEL_SLOT. Replay applies the records in order and *skips* any whose CRC fails
(a torn tail after a crash, or garbage); a partial record at the end is ignored.
A PUT of a key that lives elsewhere moves it; a PUT into an occupied slot evicts
the previous key.

The journal only records; the ordering that makes it crash safe is the
caller's (:class:`~miniflex.ssd.store.SSDStore`): data durable before its PUT,
DEL of a slot durable before new data goes into that slot. Every append is
followed by ``os.fdatasync``, so a method that returned has its records durable.

A header for another namespace digest, slot size or slot count means another
model or layout: the journal is *replaced* by an empty one (atomically, via a
temporary file and ``rename``) and :attr:`SlotJournal.reset_reason` says why.
The same temp-file-and-rename path compacts the journal (live PUTs only) when
it holds more than 4x as many records as live entries, or when replay found
bad records.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from miniflex.types import ChunkKey, SlotId

__all__ = ["JOURNAL_VERSION", "SlotJournal", "journal_geometry", "read_journal"]

log = logging.getLogger("miniflex.ssd")

JOURNAL_VERSION = 1
_MAGIC = b"MFXJNL"
_HEADER = struct.Struct("<6sH16sQQ")
_BODY = struct.Struct("<B3xI16sQQ")
_TRAILER = struct.Struct("<I4x")
RECORD_BYTES = _BODY.size + _TRAILER.size
assert _HEADER.size == _BODY.size and RECORD_BYTES == 48
_PUT, _DEL_KEY, _DEL_SLOT = 1, 2, 3
_COMPACT_RATIO = 4
_COMPACT_MIN_RECORDS = 1024

Entry = tuple[SlotId, int]
"""Where a key lives and the CRC32 of its ``slot_bytes`` bytes."""


def _sealed(body: bytes) -> bytes:
    return body + _TRAILER.pack(zlib.crc32(body))


def _record(kind: int, key: int = 0, slot: int = 0, checksum: int = 0, length: int = 0) -> bytes:
    return _sealed(_BODY.pack(kind, checksum, key.to_bytes(16, "little"), slot, length))


def _header(namespace_digest: bytes, slot_bytes: int, num_slots: int) -> bytes:
    return _sealed(_HEADER.pack(_MAGIC, JOURNAL_VERSION, namespace_digest, slot_bytes, num_slots))


def read_journal(
    path: str, namespace_digest: bytes, slot_bytes: int, num_slots: int
) -> dict[ChunkKey, Entry]:
    """Replay a journal without opening it for writing: the live ``key -> (slot, checksum)``.

    For a process that does not own the store (the scheduler seeds its SSD
    index this way after the worker has opened, and so repaired, the journal).
    Empty if the file is missing or was written for another namespace or
    geometry.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {}
    return _replay(data, _header(namespace_digest, slot_bytes, num_slots), slot_bytes, num_slots)


def journal_geometry(path: str) -> tuple[bytes, int, int] | None:
    """``(namespace digest, slot_bytes, num_slots)`` from a journal's header, for tools that
    inspect a store they did not open; None if the file or its header is unreadable."""
    try:
        with open(path, "rb") as f:
            head = f.read(RECORD_BYTES)
    except OSError:
        return None
    if (
        len(head) < RECORD_BYTES
        or zlib.crc32(head[: _HEADER.size]) != _TRAILER.unpack(head[_HEADER.size :])[0]
    ):
        return None
    magic, version, digest, slot_bytes, num_slots = _HEADER.unpack(head[: _HEADER.size])
    if magic != _MAGIC or version != JOURNAL_VERSION:
        return None
    return digest, slot_bytes, num_slots


def _replay(data: bytes, header: bytes, slot_bytes: int, num_slots: int) -> dict[ChunkKey, Entry]:
    live: dict[ChunkKey, Entry] = {}
    by_slot: dict[SlotId, ChunkKey] = {}
    if data[:RECORD_BYTES] != header:
        return live
    for at in range(RECORD_BYTES, len(data) - RECORD_BYTES + 1, RECORD_BYTES):
        _apply(data[at : at + RECORD_BYTES], live, by_slot, slot_bytes, num_slots)
    return live


def _apply(
    rec: bytes,
    live: dict[ChunkKey, Entry],
    by_slot: dict[SlotId, ChunkKey],
    slot_bytes: int,
    num_slots: int,
) -> bool:
    """Apply one record to the maps; False for a damaged or unknown record."""
    body, (crc,) = rec[: _BODY.size], _TRAILER.unpack(rec[_BODY.size :])
    if zlib.crc32(body) != crc:
        return False
    kind, checksum, raw_key, slot, length = _BODY.unpack(body)
    key, slot_id = ChunkKey(int.from_bytes(raw_key, "little")), SlotId(slot)
    if kind == _PUT and slot < num_slots and length == slot_bytes:
        _apply_put(key, slot_id, checksum, live, by_slot)
    elif kind == _DEL_KEY:
        if key in live:
            del by_slot[live.pop(key)[0]]
    elif kind == _DEL_SLOT:
        old = by_slot.pop(slot_id, None)
        if old is not None:
            del live[old]
    else:
        return False
    return True


def _apply_put(
    key: ChunkKey,
    slot: SlotId,
    checksum: int,
    live: dict[ChunkKey, Entry],
    by_slot: dict[SlotId, ChunkKey],
) -> None:
    old_key = by_slot.get(slot)
    if old_key is not None and old_key != key:
        del live[old_key]
    if key in live:
        del by_slot[live[key][0]]
    live[key] = (slot, checksum)
    by_slot[slot] = key


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SlotJournal:
    """The journal of one :class:`~miniflex.ssd.store.SSDStore`, used by its worker only.

    Not thread-safe (the store serializes calls). Appends raise ``OSError`` on
    failure after cutting the file back to its last good size, so a failed
    append never leaves a misaligned tail for the next one.
    """

    def __init__(self, path: str, namespace_digest: bytes, slot_bytes: int, num_slots: int) -> None:
        assert len(namespace_digest) == 16, "namespace digest must be 16 bytes"
        self.path = path
        self.slot_bytes = slot_bytes
        self.num_slots = num_slots
        self._header = _header(namespace_digest, slot_bytes, num_slots)
        self._live: dict[ChunkKey, Entry] = {}
        self._by_slot: dict[SlotId, ChunkKey] = {}
        self._suspect: set[SlotId] = set()
        self.reset_reason: str | None = None
        self.damaged_records = 0
        """Whole records replay skipped at open (bad CRC, unknown kind, slot out of range)."""
        self.torn_bytes = 0
        """Bytes of a partial record at the end of the file at open (a write cut short)."""
        self._fd = -1
        replayed = self._scan()
        if replayed is None:
            self._rewrite()
        else:
            records, self.damaged_records, self.torn_bytes = replayed
            self._fd = os.open(path, os.O_RDWR)
            self._size = RECORD_BYTES * (1 + records + self.damaged_records)
            self._records = records
            if self.damaged_records or self.torn_bytes:
                log.warning(
                    "SSD journal %s: skipped %d damaged record(s) and %d byte(s) of a torn "
                    "record at the end; %d record(s) replayed; compacting",
                    path,
                    self.damaged_records,
                    self.torn_bytes,
                    records,
                )
                self.compact()

    # ---- reading ----
    def replay(self) -> dict[ChunkKey, Entry]:
        """Read the journal file from disk and return the live ``key -> (slot, checksum)`` map.

        Empty if the header belongs to another namespace or geometry. Records
        with a bad CRC, a slot out of range or a length other than
        ``slot_bytes`` are skipped; a partial trailing record is ignored.
        """
        with open(self.path, "rb") as f:
            data = f.read()
        return _replay(data, self._header, self.slot_bytes, self.num_slots)

    @property
    def live(self) -> Mapping[ChunkKey, Entry]:
        """The current map (what :meth:`replay` would return), read-only."""
        return MappingProxyType(self._live)

    def needs_delete(self, slot: SlotId) -> bool:
        """True if a replay could pair ``slot`` with a PUT: delete it before overwriting it."""
        return slot in self._by_slot or slot in self._suspect

    # ---- appending (each call is durable when it returns) ----
    def put(self, entries: Iterable[tuple[ChunkKey, SlotId, int]]) -> None:
        """Record that each ``key``'s data (``checksum``) is durable in ``slot``."""
        items = list(entries)
        recs = [_record(_PUT, k, s, c, self.slot_bytes) for k, s, c in items]
        try:
            self._append(recs)
        except OSError:
            self._suspect.update(s for _, s, _ in items)  # some PUTs may be on disk after all
            raise
        for key, slot, checksum in items:
            _apply_put(key, slot, checksum, self._live, self._by_slot)
        self._maybe_compact()

    def delete_keys(self, keys: Iterable[ChunkKey]) -> None:
        """Forget ``keys`` (unknown keys are ignored)."""
        known = [k for k in keys if k in self._live]
        self._append([_record(_DEL_KEY, key=k) for k in known])
        for key in known:
            slot, _ = self._live.pop(key)
            del self._by_slot[slot]
        self._maybe_compact()

    def delete_slots(self, slots: Iterable[SlotId]) -> None:
        """Forget whatever lives in ``slots``; afterwards new data may go into them."""
        wanted = [s for s in slots if self.needs_delete(s)]
        self._append([_record(_DEL_SLOT, slot=s) for s in wanted])
        for slot in wanted:
            self._suspect.discard(slot)
            key = self._by_slot.pop(slot, None)
            if key is not None:
                del self._live[key]
        self._maybe_compact()

    def compact(self) -> None:
        """Rewrite the journal as header + one PUT per live entry (temp file, fsync, rename)."""
        self._rewrite(self._live)

    def compact_to(self, live: Mapping[ChunkKey, Entry]) -> None:
        """Rewrite the journal to hold exactly ``live`` (``{}``: forget everything)."""
        self._rewrite(live)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # ---- internals ----
    def _scan(self) -> tuple[int, int, int] | None:
        """Load the live map from disk: (records applied, damaged records, torn tail bytes);
        ``None`` (and :attr:`reset_reason`) if unusable."""
        try:
            with open(self.path, "rb") as f:
                head = f.read(RECORD_BYTES)
                data = f.read()
        except FileNotFoundError:
            return None
        if head != self._header:
            self.reset_reason = self._mismatch(head)
            log.warning("SSD journal %s: %s; starting empty", self.path, self.reset_reason)
            return None
        records = bad = 0
        for at in range(0, len(data) - RECORD_BYTES + 1, RECORD_BYTES):
            if _apply(
                data[at : at + RECORD_BYTES],
                self._live,
                self._by_slot,
                self.slot_bytes,
                self.num_slots,
            ):
                records += 1
            else:
                bad += 1
        return records, bad, len(data) % RECORD_BYTES

    def _mismatch(self, head: bytes) -> str:
        if len(head) < RECORD_BYTES or zlib.crc32(head[:-8]) != _TRAILER.unpack(head[-8:])[0]:
            return "the journal header is unreadable"
        magic, version, digest, slot_bytes, num_slots = _HEADER.unpack(head[: _HEADER.size])
        if magic != _MAGIC or version != JOURNAL_VERSION:
            return f"journal format {magic!r} v{version} is not {_MAGIC!r} v{JOURNAL_VERSION}"
        if (slot_bytes, num_slots) != (self.slot_bytes, self.num_slots):
            return (
                f"it was written for {num_slots} slots of {slot_bytes} bytes, "
                f"not {self.num_slots} of {self.slot_bytes}"
            )
        return f"it belongs to another namespace (digest {digest.hex()})"

    def _append(self, recs: list[bytes]) -> None:
        if not recs:
            return
        data = b"".join(recs)
        try:
            done = 0
            while done < len(data):
                done += os.pwrite(self._fd, data[done:], self._size + done)
            os.fdatasync(self._fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)
        self._records += len(recs)

    def _maybe_compact(self) -> None:
        if self._records <= _COMPACT_RATIO * max(len(self._live), _COMPACT_MIN_RECORDS):
            return
        try:
            self.compact()
        except OSError as exc:
            log.warning("SSD journal %s: compaction failed (%s); keeping it as is", self.path, exc)

    def _rewrite(self, live: Mapping[ChunkKey, Entry] | None = None) -> None:
        entries = dict(live or {})
        data = self._header + b"".join(
            _record(_PUT, k, s, c, self.slot_bytes) for k, (s, c) in entries.items()
        )
        tmp = f"{self.path}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            done = 0
            while done < len(data):
                done += os.pwrite(fd, data[done:], done)
            os.fsync(fd)
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.close()  # from here on every append goes to the new file
        self._fd, self._size, self._records = fd, len(data), len(entries)
        self._live = entries
        self._by_slot = {s: k for k, (s, _) in entries.items()}
        self._suspect.clear()
        _fsync_dir(os.path.dirname(os.path.abspath(self.path)))
