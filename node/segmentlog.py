"""One partition's append-only log on disk: segments, a sparse index, retention, torn-tail recovery.

This is file I/O and nothing else: the durable core (which offsets, when to
fsync, what a record means) is sans-IO and asks for appends, syncs, reads and
truncations by actions; a shell runs them here, in a worker thread, and tells
the core when they are done. The simulator puts an in-memory log with the same
methods in its place (sim/logs.py), whose power loss drops what was not
synced.

Layout: a directory per partition holding segments ``<base offset>.log`` (20
digits, so names sort by offset) and their sparse indexes ``<base>.index``.
A record is::

    u32 length of what follows the CRC | u32 CRC32C of it | u64 offset | u64 time (ms) | body

big-endian, the body an opaque msgpack document of the caller's. The offset is
in the header so that a scan, the index and a replica need not decode bodies;
offsets in a log are consecutive from the first segment's base.

The active (last) segment takes the appends; it is rolled when the next record
would take it past ``segment_bytes``. The index holds ``(offset - base, byte
position)`` every ``index_bytes`` of records; it is not fsynced, because it can
be rebuilt: on open, an index that does not fit its segment is rebuilt by a
scan, and the last segment is always scanned. That scan is the torn-tail
recovery: the first record that is cut short, has a bad CRC, a wrong offset or
a length past ``max_record`` ends the log, and it and everything after it are
cut (``Recovery.cut_bytes`` says how much, for the log line). A bad record in an
older, closed segment is not cut (records after it were acknowledged): the
open fails with ``LogCorrupt``, naming the file and the position.

Retention deletes whole closed segments, oldest first: those whose newest
record is older than ``retention_age`` and those that keep the log over
``retention_bytes``. The active segment is never deleted.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import BinaryIO

from crc32c import crc32c

HEADER = struct.Struct(">IIQQ")  # length, crc32c, offset, time ms
PREFIX = 8  # length + crc: what the length does not count
INDEX_ENTRY = struct.Struct(">II")  # offset - base, position
NAME_DIGITS = 20


class LogCorrupt(Exception):
    """A closed segment holds a damaged record: the log cannot be opened as it is."""


class LogUsage(ValueError):
    """A call that does not fit the log (an offset that is not the next one, say)."""


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    time_ms: int
    body: bytes


@dataclass
class Recovery:
    """What opening found, for the log line of the member that opened it."""

    segments: int = 0
    records_scanned: int = 0
    cut_bytes: int = 0  # torn tail cut from the last segment
    cut_at: int | None = None  # the offset the cut began at (the new end)
    cut_reason: str = ""
    indexes_rebuilt: int = 0


@dataclass
class Segment:
    base: int
    path: Path
    size: int = 0
    end: int = 0  # next offset after this segment's last record
    first_ms: int | None = None
    last_ms: int | None = None
    index: list[tuple[int, int]] = field(default_factory=list)  # (offset, position), ascending
    indexed_at: int = 0  # position of the last index entry (or 0)

    @property
    def index_path(self) -> Path:
        return self.path.with_suffix(".index")


def sync_dir(d: str | Path) -> None:
    """fsync a directory: the names made, replaced or removed in it last through a power loss."""
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _name(base: int) -> str:
    return f"{base:0{NAME_DIGITS}d}"


def encode_record(offset: int, time_ms: int, body: bytes) -> bytes:
    rest = struct.pack(">QQ", offset, time_ms) + body
    return struct.pack(">II", len(rest), crc32c(rest)) + rest


class SegmentLog:
    """A partition's log in ``directory``; not thread-safe: one worker at a time uses it."""

    def __init__(self, directory: Path, *, segment_bytes: int = 16 << 20, index_bytes: int = 4096,
                 max_record: int = 2 << 20) -> None:  # fmt: skip
        self.dir = directory
        self.segment_bytes = segment_bytes
        self.index_bytes = index_bytes
        self.max_record = max_record
        self.segments: list[Segment] = []
        self._file: BinaryIO | None = None  # the active segment, open for appending
        self._dirty = False  # appended since the last sync
        self._dir_dirty = False  # a segment created or deleted since the last sync
        self.wanted = 0  # where the last ``retain`` would have started the log without its keep_from

    # ------------------------------------------------------------ open and recover

    @classmethod
    def open(cls, directory: Path, **settings: int) -> tuple[SegmentLog, Recovery]:
        log = cls(directory, **settings)
        return log, log._recover()

    def _recover(self) -> Recovery:
        self.dir.mkdir(parents=True, exist_ok=True)
        rec = Recovery()
        for p in sorted(self.dir.glob("*.log")):
            stem = p.stem
            if len(stem) != NAME_DIGITS or not stem.isdigit():
                continue  # not ours
            self.segments.append(Segment(int(stem), p))
        for p in self.dir.glob("*.index"):
            if not p.with_suffix(".log").exists():
                p.unlink()  # an index whose segment retention deleted
        rec.segments = len(self.segments)
        for i, seg in enumerate(self.segments):
            seg.size = seg.path.stat().st_size
            last = i == len(self.segments) - 1
            if not last and self._load_index(seg, self.segments[i + 1].base):
                self._scan(seg, rec, from_index=True)
                continue
            if not last:
                rec.indexes_rebuilt += 1
            self._scan(seg, rec, from_index=False, torn_ok=last)
            self._write_index(seg)
            if not last and seg.end != self.segments[i + 1].base:
                raise LogCorrupt(f"{seg.path}: ends at offset {seg.end}, the next segment begins at "
                                 f"{self.segments[i + 1].base}")  # fmt: skip
        if not self.segments:
            self._new_segment(0)
        self._open_active()
        return rec

    def _load_index(self, seg: Segment, next_base: int) -> bool:
        """The index file of a closed segment, if it fits the segment."""
        try:
            data = seg.index_path.read_bytes()
        except FileNotFoundError:
            return False
        if len(data) % INDEX_ENTRY.size:
            return False
        entries = [(seg.base + r, pos) for r, pos in INDEX_ENTRY.iter_unpack(data)]
        if any(b[0] <= a[0] or b[1] <= a[1] for a, b in pairwise(entries)):
            return False
        if entries and (entries[-1][0] >= next_base or entries[-1][1] >= seg.size):
            return False
        seg.index = entries
        seg.end = next_base
        return True

    def _scan(self, seg: Segment, rec: Recovery, *, from_index: bool, torn_ok: bool = False) -> None:
        """Read the segment's records: all of them (a rebuild, the last segment), or from its
        last index entry on (to learn its times); the first bad record ends it."""
        with open(seg.path, "rb") as f:
            data = f.read()
        pos, expect = 0, seg.base
        if from_index:
            seg.first_ms = self._time_at(data, 0)
            if seg.index:
                expect, pos = seg.index[-1]
        else:
            seg.index, seg.indexed_at = [], 0
        last_ms = seg.first_ms
        while pos < len(data):
            why = ""
            if len(data) - pos < HEADER.size:
                why = "a record cut short"
            else:
                length, crc, offset, ms = HEADER.unpack_from(data, pos)
                end = pos + PREFIX + length
                if length < HEADER.size - PREFIX or length > self.max_record + HEADER.size:
                    why = f"a record length of {length} bytes"
                elif end > len(data):
                    why = "a record cut short"
                elif crc32c(data[pos + PREFIX : end]) != crc:
                    why = "a bad CRC"
                elif offset != expect:
                    why = f"offset {offset} where {expect} was next"
            if why:
                if not torn_ok:
                    raise LogCorrupt(f"{seg.path}: {why} at byte {pos}; the segment is closed, "
                                     "so records after it were acknowledged")  # fmt: skip
                rec.cut_bytes, rec.cut_at, rec.cut_reason = len(data) - pos, expect, why
                with open(seg.path, "r+b") as f:
                    f.truncate(pos)
                    os.fsync(f.fileno())
                seg.size = pos
                break
            if not from_index and (not seg.index or pos - seg.indexed_at >= self.index_bytes):
                seg.index.append((offset, pos))
                seg.indexed_at = pos
            if seg.first_ms is None:
                seg.first_ms = ms
            last_ms = ms
            rec.records_scanned += 1
            expect, pos = offset + 1, end
        seg.last_ms = last_ms
        if not from_index:
            seg.end = expect
        elif expect != seg.end:
            raise LogCorrupt(f"{seg.path}: records end at offset {expect}, the next segment begins at {seg.end}")

    @staticmethod
    def _time_at(data: bytes, pos: int) -> int | None:
        if len(data) - pos < HEADER.size:
            return None
        return int(HEADER.unpack_from(data, pos)[3])

    def _write_index(self, seg: Segment) -> None:
        seg.index_path.write_bytes(b"".join(INDEX_ENTRY.pack(o - seg.base, p) for o, p in seg.index))

    # ------------------------------------------------------------ the log's extent

    @property
    def start(self) -> int:
        """The first offset still in the log."""
        return self.segments[0].base

    @property
    def end(self) -> int:
        """The offset the next record gets."""
        return self.segments[-1].end

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)

    # ------------------------------------------------------------ writing

    def _new_segment(self, base: int) -> None:
        seg = Segment(base, self.dir / f"{_name(base)}.log", end=base)
        seg.path.touch()
        self.segments.append(seg)
        self._dir_dirty = True

    def _open_active(self) -> None:
        self._close_file()
        self._file = open(self.segments[-1].path, "ab")  # noqa: SIM115 (kept open for appends)

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def append(self, records: list[Record]) -> None:
        """Write records after the last one (offsets must follow on); not synced yet."""
        for r in records:
            if r.offset != self.end:
                raise LogUsage(f"append of offset {r.offset}, the log ends at {self.end}")
            if len(r.body) > self.max_record:
                raise LogUsage(f"a record of {len(r.body)} bytes, over max_record ({self.max_record})")
            data = encode_record(r.offset, r.time_ms, r.body)
            seg = self.segments[-1]
            if seg.size and seg.size + len(data) > self.segment_bytes:
                self._roll()
                seg = self.segments[-1]
            assert self._file is not None
            self._file.write(data)
            if not seg.index or seg.size - seg.indexed_at >= self.index_bytes:
                seg.index.append((r.offset, seg.size))
                seg.indexed_at = seg.size
            if seg.first_ms is None:
                seg.first_ms = r.time_ms
            seg.last_ms = r.time_ms
            seg.size += len(data)
            seg.end = r.offset + 1
            self._dirty = True

    def _roll(self) -> None:
        """Close the active segment (synced, its index written) and start the next."""
        self._sync_file()
        old = self.segments[-1]
        self._write_index(old)
        self._new_segment(old.end)
        self._open_active()

    def _sync_file(self) -> None:
        if self._file is not None:
            self._file.flush()
            if self._dirty:
                os.fsync(self._file.fileno())
        self._dirty = False

    def sync(self) -> int:
        """Everything appended is on disk; returns the end offset that is now durable."""
        self._sync_file()
        if self._dir_dirty:
            sync_dir(self.dir)
            self._dir_dirty = False
        return self.end

    def flush(self) -> None:
        """Hand appends to the OS (readable, not durable): the policy ``never`` syncs no more."""
        if self._file is not None:
            self._file.flush()

    def reset(self, start: int) -> None:
        """Drop every record and begin again at ``start``: a replica that is to copy a log whose
        first retained offset is past its own end. Synced before it returns."""
        self._close_file()
        for seg in self.segments:
            seg.path.unlink()
            seg.index_path.unlink(missing_ok=True)
        self.segments = []
        self._new_segment(start)
        self._open_active()
        self.sync()

    def truncate(self, to: int) -> None:
        """Cut every record at ``to`` and after: a replica whose tail the new primary does not
        have. Synced before it returns, so a crash cannot bring the cut records back."""
        if to >= self.end:
            return
        if to < self.start:
            raise LogUsage(f"truncate to {to}, before the log's start {self.start}")
        self._close_file()
        while len(self.segments) > 1 and self.segments[-1].base >= to and self.segments[-1].base > self.start:
            seg = self.segments.pop()
            seg.path.unlink()
            seg.index_path.unlink(missing_ok=True)
            self._dir_dirty = True
        seg = self.segments[-1]
        pos = self._position(seg, to)
        with open(seg.path, "r+b") as f:
            f.truncate(pos)
            os.fsync(f.fileno())
        seg.size, seg.end = pos, to
        seg.index = [(o, p) for o, p in seg.index if o < to]
        seg.indexed_at = seg.index[-1][1] if seg.index else 0
        if seg.end == seg.base:
            seg.first_ms = seg.last_ms = None
        self._open_active()
        self.sync()

    # ------------------------------------------------------------ reading

    def _position(self, seg: Segment, offset: int) -> int:
        """Byte position of ``offset`` in ``seg`` (its end if past it): index, then a short scan."""
        if offset >= seg.end:
            return seg.size
        i = bisect_right(seg.index, (offset, 1 << 62)) - 1
        o, pos = seg.index[i] if i >= 0 else (seg.base, 0)
        with open(seg.path, "rb") as f:
            f.seek(pos)
            while o < offset:
                head = f.read(4)
                if len(head) != 4:
                    raise LogCorrupt(f"{seg.path}: the file ends before offset {offset} (damaged after it was opened)")
                pos += PREFIX + struct.unpack(">I", head)[0]
                f.seek(pos)
                o += 1
        return pos

    def read(self, start: int, max_bytes: int = 1 << 20, max_records: int = 1000) -> list[Record]:
        """Records from ``start`` (at least one if there is one, then up to the limits)."""
        self.flush()
        out: list[Record] = []
        start = max(start, self.start)
        size = 0
        i = bisect_right([s.base for s in self.segments], start) - 1
        while i < len(self.segments) and len(out) < max_records:
            seg = self.segments[i]
            if start < seg.end:
                pos = self._position(seg, start)
                with open(seg.path, "rb") as f:
                    f.seek(pos)
                    while start < seg.end and len(out) < max_records:
                        r = self._read_record(f, seg, start)
                        if out and size + len(r.body) > max_bytes:
                            return out
                        out.append(r)
                        size += len(r.body)
                        start = r.offset + 1
            i += 1
        return out

    def _read_record(self, f: BinaryIO, seg: Segment, offset: int) -> Record:
        """The record at ``offset``, checked as recovery checks one: the file may have been damaged
        since it was opened, and a garbage length must not become a huge read."""
        head = f.read(HEADER.size)
        length, crc, at, ms = HEADER.unpack(head) if len(head) == HEADER.size else (0, 0, 0, 0)
        n = length - (HEADER.size - PREFIX)
        body = f.read(n) if 0 <= n <= self.max_record else b""
        if len(body) != n or crc32c(head[PREFIX:] + body) != crc:
            raise LogCorrupt(f"{seg.path}: the record at offset {offset} is damaged (length or CRC)")
        if at != offset:
            raise LogCorrupt(f"{seg.path}: offset {at} found where {offset} was expected")
        return Record(at, ms, body)

    def offset_for_time(self, time_ms: int) -> int:
        """The first offset whose record is at or after ``time_ms`` (the end if none is), read a
        chunk at a time (a segment can be far larger than what should be in memory at once)."""
        for seg in self.segments:
            if seg.last_ms is not None and seg.last_ms >= time_ms:
                at = seg.base
                while at < seg.end:
                    chunk = self.read(at, max_records=1000)
                    for r in chunk:
                        if r.time_ms >= time_ms:
                            return r.offset
                    at = chunk[-1].offset + 1 if chunk else seg.end
        return self.end

    # ------------------------------------------------------------ retention

    def retain(self, now_ms: int, max_bytes: int, max_age_ms: int, keep_from: int | None = None) -> list[int]:
        """Delete closed segments past the retention limits, but none holding ``keep_from`` or a
        later offset; returns the bases deleted. ``wanted`` is then where the log would start
        without ``keep_from``."""
        gone: list[int] = []
        self.wanted = self.start
        size = self.size
        for seg, nxt in pairwise(self.segments):
            old = seg.last_ms is not None and seg.last_ms < now_ms - max_age_ms
            if not (old or size > max_bytes):
                break
            size -= seg.size
            self.wanted = nxt.base
        upto = self.wanted if keep_from is None else min(self.wanted, keep_from)
        while len(self.segments) > 1 and self.segments[1].base <= upto:
            seg = self.segments[0]
            self.segments.pop(0)
            seg.path.unlink()
            seg.index_path.unlink(missing_ok=True)
            self._dir_dirty = True
            gone.append(seg.base)
        return gone

    def close(self) -> None:
        self.sync()
        for seg in self.segments[-1:]:
            self._write_index(seg)
        self._close_file()
