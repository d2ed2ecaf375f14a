"""The metadata quorum's Raft state on real files: term and vote, snapshot, log; recovery at start.

Theory of operation
-------------------
A member's shell opens a ``RaftStore`` on ``<data_dir>/quorum/`` (``QUORUM_DIR``) before its
Raft core starts: ``open()`` reads back a ``Stored`` (cluster/raftstate.py) for the core; then
each ``persist(RaftPersist)`` the core asks for is applied and fsynced before it returns, so
the shell may answer ``persisted(token)`` right after. Like node/segmentlog.py this is blocking
file I/O and decides nothing: the shell runs it in a worker thread, one call at a time.

The directory holds three things:

- ``state``: the current term and vote. Raft is unsafe if a member forgets whom it voted for
  in a term (it could vote twice, and two leaders be elected), so the file is replaced, never
  edited: written whole to ``state.tmp``, fsynced, renamed over ``state``, the directory
  fsynced. A crash leaves the old file or the new one. It is rewritten only when term or vote
  change.
- ``snapshot``: the last snapshot (index, term, data), replaced the same way.
- ``log/``: the entries after the snapshot, a node/segmentlog.py ``SegmentLog`` whose offset
  is the entry's index and whose body is msgpack ``[term, command]`` (time 0). It brings its
  CRC32C per record and its torn-tail recovery: a record cut short by a crash is cut at open.

``state`` and ``snapshot`` are ``magic | u32 CRC32C of the rest | the rest``, big-endian (see
``encode_state`` and ``encode_snapshot``). The CRC finds a torn or garbled file: the open then
fails naming it, since a vote silently forgotten is worse than a member that will not start.
A missing file is the empty value (a new member; or no snapshot yet). Everything read back is
range-checked where it is decoded (``decode_state_untrusted``, ``decode_snapshot_untrusted``,
``decode_entry_untrusted``), so a damaged file can only ever raise their ``ValueError``.

Installing a snapshot writes the snapshot file first, then rebuilds the log to begin right
after it: the entries above the snapshot stay when the log's entry at its index has its term,
otherwise none do. The rebuilt log is made in ``log.new`` and renamed into place (the old one
renamed to ``log.old`` first, then deleted), so a crash leaves the old log whole or the new one,
and ``open`` finishes or discards what it finds. A segment log alone could not do this safely:
it cuts only whole segments from its head, and its reset deletes segments one by one. A crash
between the snapshot file and the rename leaves a log that does not begin right after the
snapshot: ``open`` rebuilds it the same way (keeping the entries above the snapshot if the log
agrees with it, none otherwise, and none if it does not reach past it). A log that begins after
``snapshot_index + 1`` has lost entries, and the open refuses.

``check_persist`` holds the rules a persist must follow (indexes contiguous, terms that never
go back, one vote per term, no cut into the snapshot); the simulator's disk (sim/raftdisk.py)
applies the same function, so both refuse the same requests, and before anything is written.
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import msgpack
from crc32c import crc32c

from roost.cluster.raftstate import RaftPersist, Stored
from roost.node.segmentlog import LogCorrupt, LogUsage, Record, SegmentLog, sync_dir

QUORUM_DIR = "quorum"  # under the member's data_dir
STATE_FILE = "state"
SNAPSHOT_FILE = "snapshot"
LOG_DIR = "log"
NEW_LOG_DIR = "log.new"  # a rebuilt log before it is renamed into place
OLD_LOG_DIR = "log.old"  # the log it replaces, until it is deleted

STATE_MAGIC = b"RQT1"  # term and vote, format 1
SNAPSHOT_MAGIC = b"RQS1"  # snapshot, format 1
CRC = struct.Struct(">I")
STATE_HEAD = struct.Struct(">QBH")  # term, 1 if a vote follows else 0, the vote's length
SNAPSHOT_HEAD = struct.Struct(">QQQ")  # index, term, length of the data

MAX_INT = (1 << 63) - 1  # terms and indexes: what a SegmentLog offset and msgpack hold either way
MAX_VOTE = 1024  # bytes of a member id in UTF-8: far above any configured id
MAX_COMMAND = 8 << 20  # bytes of one entry's command
ENTRY_OVERHEAD = 16  # msgpack [term, command] around the command: the SegmentLog's max_record margin
READ_CHUNK = 1000  # entries read at a time at open

T = TypeVar("T")


class RaftStoreError(Exception):
    """The store cannot do what was asked: a damaged file (named), a failed write (the file and
    the OS error), or a persist that breaks the rules (``check_persist``)."""


# ---------------------------------------------------------------- file formats


def _check_int(v: object, what: str, low: int = 0) -> int:
    if type(v) is not int or not low <= v <= MAX_INT:
        raise ValueError(f"{what} {v!r} is not an integer in [{low}, {MAX_INT}]")
    return v


def seal(magic: bytes, body: bytes) -> bytes:
    return magic + CRC.pack(crc32c(body)) + body


def unseal(magic: bytes, data: bytes) -> bytes:
    """The body of a sealed file, its magic and CRC checked; ValueError otherwise."""
    if len(data) < len(magic) + CRC.size:
        raise ValueError(f"{len(data)} bytes: shorter than a header")
    if data[: len(magic)] != magic:
        raise ValueError(f"magic {data[: len(magic)]!r}, not {magic!r}")
    body = data[len(magic) + CRC.size :]
    if CRC.unpack_from(data, len(magic))[0] != crc32c(body):
        raise ValueError("bad CRC32C (a torn or garbled file)")
    return body


def encode_state(term: int, vote: str | None) -> bytes:
    """``STATE_MAGIC | crc | u64 term | u8 has vote | u16 vote length | vote (UTF-8)``."""
    raw = b"" if vote is None else vote.encode()
    return seal(STATE_MAGIC, STATE_HEAD.pack(term, vote is not None, len(raw)) + raw)


def decode_state_untrusted(data: bytes) -> tuple[int, str | None]:
    """(term, vote) from a ``state`` file's bytes; ValueError for anything else."""
    body = unseal(STATE_MAGIC, data)
    if len(body) < STATE_HEAD.size:
        raise ValueError(f"a body of {len(body)} bytes, shorter than term and vote")
    term, has_vote, n = STATE_HEAD.unpack_from(body)
    _check_int(term, "term")
    if has_vote not in (0, 1):
        raise ValueError(f"vote flag {has_vote}, not 0 or 1")
    if n > MAX_VOTE or (not has_vote and n):
        raise ValueError(f"a vote of {n} bytes")
    if len(body) != STATE_HEAD.size + n:
        raise ValueError(f"a body of {len(body)} bytes where {STATE_HEAD.size + n} were due")
    if not has_vote:
        return term, None
    try:
        return term, body[STATE_HEAD.size :].decode()
    except UnicodeDecodeError as e:
        raise ValueError(f"a vote that is not UTF-8: {e}") from None


def encode_snapshot(index: int, term: int, data: bytes) -> bytes:
    """``SNAPSHOT_MAGIC | crc | u64 index | u64 term | u64 data length | data``."""
    return seal(SNAPSHOT_MAGIC, SNAPSHOT_HEAD.pack(index, term, len(data)) + data)


def decode_snapshot_untrusted(data: bytes) -> tuple[int, int, bytes]:
    """(index, term, data) from a ``snapshot`` file's bytes; ValueError for anything else."""
    body = unseal(SNAPSHOT_MAGIC, data)
    if len(body) < SNAPSHOT_HEAD.size:
        raise ValueError(f"a body of {len(body)} bytes, shorter than index, term and length")
    index, term, n = SNAPSHOT_HEAD.unpack_from(body)
    _check_int(index, "snapshot index", 1)
    _check_int(term, "snapshot term")
    if n != len(body) - SNAPSHOT_HEAD.size:
        raise ValueError(f"data of {n} bytes announced, {len(body) - SNAPSHOT_HEAD.size} present")
    return index, term, body[SNAPSHOT_HEAD.size :]


def encode_entry(term: int, command: bytes) -> bytes:
    """A log record's body: msgpack ``[term, command]``."""
    body: bytes = msgpack.packb([term, command], use_bin_type=True)
    return body


def decode_entry_untrusted(body: bytes) -> tuple[int, bytes]:
    """(term, command) from a log record's body; ValueError for anything else."""
    try:
        v = msgpack.unpackb(body, raw=False, strict_map_key=True, max_bin_len=MAX_COMMAND, max_str_len=0,
                            max_array_len=2, max_map_len=0, max_ext_len=0)  # fmt: skip
    except (ValueError, msgpack.UnpackException) as e:
        raise ValueError(f"not an entry: {e}") from None
    if type(v) is not list or len(v) != 2 or type(v[1]) is not bytes:
        raise ValueError("not an entry: [term, command] expected")
    return _check_int(v[0], "entry term"), v[1]


def replace_file(directory: Path, name: str, data: bytes) -> None:
    """Write ``directory/name`` whole: a temporary file (``name.tmp``), fsynced, renamed over it,
    the directory fsynced. A crash leaves the old file or the new one (and perhaps a ``.tmp`` to
    delete). cluster/epochstore.py writes the map epochs' ceiling with it too."""
    path = directory / name
    tmp = path.with_name(name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    sync_dir(directory)


# ---------------------------------------------------------------- the rules of a persist


def check_persist(a: RaftPersist, *, term: int, vote: str | None, snapshot_index: int, snapshot_term: int,
                  end: int, term_at: Callable[[int], int | None], where: str,
                  max_command: int = MAX_COMMAND) -> None:  # fmt: skip
    """Raise ``RaftStoreError`` if ``a`` cannot be applied to a store in this state (``end``: the
    index the next entry gets; ``term_at(i)``: the term of the entry at ``i``, the snapshot's at
    its index, None where there is none); returns having changed nothing either way.

    The checks are those that keep the store something ``open`` accepts and Raft's promises
    kept: a term never goes back, a vote once cast in a term stays, the log is contiguous with
    terms that never go back, and nothing at or below the snapshot is cut. A core that breaks one
    is wrong, and the shell should stop it rather than write what it asked.
    """

    def refuse(why: str) -> RaftStoreError:
        return RaftStoreError(f"{where}: persist {a.token} refused: {why}")

    try:
        if a.snapshot is not None:
            index, sterm, data = a.snapshot
            _check_int(index, "snapshot index", 1)
            _check_int(sterm, "snapshot term")
            if type(data) is not bytes:
                raise ValueError("snapshot data that is not bytes")
            if index < snapshot_index:
                raise ValueError(f"a snapshot at {index}, behind the one held at {snapshot_index}")
            if term_at(index) != sterm:
                end = index + 1  # (the log goes: it does not agree with the snapshot)
            snapshot_index, snapshot_term = index, sterm
        if a.truncate_after is not None:
            _check_int(a.truncate_after, "truncate_after")
            if a.truncate_after < snapshot_index:
                raise ValueError(f"a cut after {a.truncate_after}, into the snapshot at {snapshot_index}")
            end = min(end, a.truncate_after + 1)
        if a.entries:
            last = end - 1
            prev = snapshot_term if last == snapshot_index else term_at(last)
            assert prev is not None, (where, last)  # (the log holds every index in (snapshot_index, end))
            for index, eterm, command in a.entries:
                if index != last + 1:
                    raise ValueError(f"entry {index!r} where {last + 1} is next")
                _check_int(eterm, f"the term of entry {index}")
                if eterm < prev:
                    raise ValueError(f"entry {index} of term {eterm} after one of term {prev}")
                if type(command) is not bytes or len(command) > max_command:
                    raise ValueError(f"entry {index}: a command that is not bytes of at most {max_command}")
                last, prev = index, eterm
        _check_int(a.term, "term")
        if a.term < term:
            raise ValueError(f"term {a.term}, behind {term}")
        if a.vote is not None and (type(a.vote) is not str or len(a.vote.encode()) > MAX_VOTE):
            raise ValueError(f"a vote that is not a member id of at most {MAX_VOTE} bytes: {a.vote!r}")
        if a.term == term and vote is not None and a.vote != vote:
            raise ValueError(f"a vote for {a.vote!r} in term {term}, where {vote!r} has it")
    except ValueError as e:
        raise refuse(str(e)) from None


# ---------------------------------------------------------------- the store


class RaftStore:
    """One member's Raft state in ``directory`` (the shell passes ``<data_dir>/quorum``)."""

    def __init__(self, directory: Path, *, max_command: int = MAX_COMMAND, segment_bytes: int = 16 << 20) -> None:
        self.dir = directory
        self.max_command = max_command
        self.segment_bytes = segment_bytes
        self.log: SegmentLog | None = None  # (None: not open); its first entry is always snapshot_index + 1
        self.term = 0
        self.vote: str | None = None
        self.snapshot_index = 0
        self.snapshot_term = 0
        self.cut_bytes = 0  # the torn tail open cut from the log (for the shell's log line)
        self.dropped = 0  # entries after the snapshot that open dropped: their log disagreed with it
        self._failed: str | None = None  # a persist failed half way: refuse the rest

    # ------------------------------------------------------------ open and recover

    def open(self) -> Stored:
        """Read everything back, repairing what a crash can leave; ``RaftStoreError`` naming the
        file when something cannot be trusted."""
        if self.log is not None:
            raise RaftStoreError(f"{self.dir}: already open")
        try:
            try:
                return self._open()
            except BaseException:
                self.close()  # (a store that did not open holds no file)
                raise
        except OSError as e:
            raise RaftStoreError(f"{e.filename or self.dir}: {e.strerror or e}") from e
        except (LogCorrupt, LogUsage) as e:
            raise RaftStoreError(f"{self.dir / LOG_DIR}: {e}") from e

    def _open(self) -> Stored:
        new = not self.dir.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
        if new:
            sync_dir(self.dir.parent)
        for tmp in self.dir.glob("*.tmp"):  # (a replace that a crash cut short: the old file stands)
            tmp.unlink()
        state = self._read(STATE_FILE, decode_state_untrusted)
        self.term, self.vote = state if state is not None else (0, None)
        snap = self._read(SNAPSHOT_FILE, decode_snapshot_untrusted)
        self.snapshot_index, self.snapshot_term, data = snap if snap is not None else (0, 0, None)
        self._finish_swap()
        logdir = self.dir / LOG_DIR
        self.log, recovery = SegmentLog.open(logdir, **self._log_settings())
        self.cut_bytes = recovery.cut_bytes
        log, s, first = self.log, self.snapshot_index, self.snapshot_index + 1
        if log.start > first:
            raise RaftStoreError(f"{logdir}: entries begin at {log.start}, the snapshot ends at {s}: "
                                 f"entries are missing")  # fmt: skip
        if log.start < first:  # (a new log at 0, or a crash between a snapshot and the log's rebuild)
            if log.start == 0 < log.end:
                raise RaftStoreError(f"{logdir}: holds an entry at index 0")
            agrees = log.end > first and (s == 0 or self._term_in_log(s) == self.snapshot_term)
            self.dropped = 0 if agrees else max(0, log.end - first)  # (for the shell's log line)
            self._rebuild(first, keep=agrees)
        return Stored(self.term, self.vote, s, self.snapshot_term, data, self._entries(first))

    def _log_settings(self) -> dict[str, int]:
        return {"segment_bytes": self.segment_bytes, "max_record": self.max_command + ENTRY_OVERHEAD}

    def _read(self, name: str, decode: Callable[[bytes], T]) -> T | None:
        path = self.dir / name
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return decode(raw)
        except ValueError as e:
            raise RaftStoreError(f"{path}: damaged, refusing to start without it: {e}") from None

    def _entries(self, first: int) -> list[tuple[int, bytes]]:
        """Every entry from ``first`` on, terms checked never to go back."""
        assert self.log is not None
        out: list[tuple[int, bytes]] = []
        prev, at = self.snapshot_term, first
        while at < self.log.end:
            for r in self.log.read(at, max_bytes=64 << 20, max_records=READ_CHUNK):
                term, command = self._decode(r)
                if term < prev:
                    raise RaftStoreError(f"{self.dir / LOG_DIR}: entry {r.offset} of term {term} after one of "
                                         f"term {prev}")  # fmt: skip
                out.append((term, command))
                prev, at = term, r.offset + 1
        return out

    def _decode(self, r: Record) -> tuple[int, bytes]:
        try:
            return decode_entry_untrusted(r.body)
        except ValueError as e:
            raise RaftStoreError(f"{self.dir / LOG_DIR}: entry {r.offset}: {e}") from None

    def _term_in_log(self, index: int) -> int | None:
        assert self.log is not None
        if not self.log.start <= index < self.log.end:
            return None
        (r,) = self.log.read(index, max_records=1)
        return self._decode(r)[0]

    def term_at(self, index: int) -> int | None:
        """The term of the entry at ``index`` (the snapshot's at its index), None where none is."""
        if index == self.snapshot_index:
            return self.snapshot_term
        return self._term_in_log(index) if index > self.snapshot_index else None

    # ------------------------------------------------------------ the log rebuilt whole

    def _rebuild(self, first: int, *, keep: bool) -> None:
        """Replace the log by one that begins at ``first``, holding the entries the old one has
        from ``first`` on if ``keep``; atomically, by a rename: a crash leaves the old log whole
        (``open`` repairs it again) or the new one (``_finish_swap``), never a log with a hole.
        A segment log can only cut whole segments from its head, and its reset deletes segments
        one by one, so a crash in either could leave a log whose entries do not follow the
        snapshot; here the snapshot is always followed right away by the first entry."""
        old, new = self.log, self.dir / NEW_LOG_DIR
        if new.exists():
            shutil.rmtree(new)
        log, _ = SegmentLog.open(new, **self._log_settings())
        log.reset(first)  # (in a directory nothing reads yet: a crash here leaves only leftovers)
        if keep and old is not None:
            at = first
            while at < old.end:
                records = old.read(at, max_bytes=4 << 20, max_records=READ_CHUNK)
                log.append([Record(r.offset, 0, r.body) for r in records])
                at = records[-1].offset + 1
        log.close()
        self.log = None
        if old is not None:
            old.close()
        logdir, gone = self.dir / LOG_DIR, self.dir / OLD_LOG_DIR
        if logdir.exists():
            os.replace(logdir, gone)
        os.replace(new, logdir)
        sync_dir(self.dir)
        if gone.exists():
            shutil.rmtree(gone)
        self.log, _ = SegmentLog.open(logdir, **self._log_settings())

    def _finish_swap(self) -> None:
        """What a crash in ``_rebuild`` left: the new log if it was complete (the old one was
        renamed away), leftovers otherwise."""
        logdir, new, gone = self.dir / LOG_DIR, self.dir / NEW_LOG_DIR, self.dir / OLD_LOG_DIR
        if not logdir.exists() and new.exists():
            os.replace(new, logdir)  # (the old log went only once the new one was complete)
        elif not logdir.exists() and gone.exists():
            os.replace(gone, logdir)  # (cannot happen, but the old log is better than none)
        for leftover in (new, gone):
            if leftover.exists():
                shutil.rmtree(leftover)
        sync_dir(self.dir)

    # ------------------------------------------------------------ persist

    def persist(self, a: RaftPersist) -> None:
        """Apply ``a`` (snapshot, cut, append, term and vote) and fsync it all: when this returns
        the shell may answer ``persisted(a.token)``. A request ``check_persist`` refuses changes
        nothing; a write that fails leaves the store refusing everything but ``close``.

        Term and vote do not depend on the log, so the state file, which is fsynced on its own,
        is replaced before the log is touched rather than after the appends: entries that reach
        the disk before the barrier (a crash may keep any of them) then never carry a term above
        the term stored, which a Raft core may take for granted when it starts.
        """
        if self.log is None:
            raise RaftStoreError(f"{self.dir}: persist before open")
        if self._failed is not None:
            raise RaftStoreError(f"{self.dir}: an earlier persist failed ({self._failed}); reopen the store")
        try:
            check_persist(a, term=self.term, vote=self.vote, snapshot_index=self.snapshot_index,
                          snapshot_term=self.snapshot_term, end=self.log.end, term_at=self.term_at,
                          where=str(self.dir), max_command=self.max_command)  # fmt: skip
            if (a.term, a.vote) != (self.term, self.vote):  # (first: see below)
                self._replace(STATE_FILE, encode_state(a.term, a.vote))
                self.term, self.vote = a.term, a.vote
            if a.snapshot is not None:
                self._install(*a.snapshot)
            log = self.log
            assert log is not None
            if a.truncate_after is not None:
                log.truncate(a.truncate_after + 1)
            if a.entries:
                log.append([Record(i, 0, encode_entry(t, c)) for i, t, c in a.entries])
            log.sync()  # (the barrier: the appends, and the directory if a segment came or went)
        except OSError as e:
            self._failed = f"{e.filename or self.dir}: {e.strerror or e}"
            raise RaftStoreError(self._failed) from e
        except (LogCorrupt, LogUsage) as e:
            self._failed = f"{self.dir / LOG_DIR}: {e}"
            raise RaftStoreError(self._failed) from e

    def _install(self, index: int, term: int, data: bytes) -> None:
        """The snapshot file first, then the log rebuilt to begin right after it (with the entries
        above it if the log agrees): a crash between the two is repaired by ``open``."""
        agrees = self.term_at(index) == term
        self._replace(SNAPSHOT_FILE, encode_snapshot(index, term, data))
        self.snapshot_index, self.snapshot_term = index, term
        self._rebuild(index + 1, keep=agrees)

    def _replace(self, name: str, data: bytes) -> None:
        replace_file(self.dir, name, data)

    def close(self) -> None:
        """Sync and close the log (idempotent)."""
        log, self.log = self.log, None
        if log is not None:
            try:
                log.close()
            except OSError as e:
                raise RaftStoreError(f"{e.filename or self.dir / LOG_DIR}: {e.strerror or e}") from e
