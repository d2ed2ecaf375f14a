"""A real member's durable partition logs on disk, for the trio shell (cluster/server.py).

The member core (cluster/durable.py) decides; this runs what it asks on
node/segmentlog.py, blocking, so the shell calls it in a worker thread: at
start, ``open_all`` opens every partition directory under ``<data_dir>/log``
(torn tails cut, each cut logged) and returns the ``LogsRead`` event fed before
``Start``; then ``perform`` does one ``Append``/``Truncate``/``ResetLog``/
``ReadLog`` and returns the event that answers it. The shell keeps one queue
per partition, so each partition's work is done in the order the core gave it.
An ``Append`` with ``sync`` returns only after fsync (fsync policy ``always``);
with ``interval`` the shell's timer queues a ``Sync`` on every partition's
queue every ``fsync_interval``; ``never`` leaves it to the OS.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from roost.cluster.events import LogFailed, LogRecords, LogReloaded, LogRetained, LogsRead, LogWritten, SeenSaved
from roost.cluster.logrecords import LogFormatError, LogScan
from roost.cluster.partitionlog import Append, LogSettings, ReadLog, Reload, ResetLog, Retain, SaveSeen, Truncate
from roost.node.segmentlog import LogCorrupt, LogUsage, SegmentLog, sync_dir

PREFIX = "p"  # partition directories: p00000, p00001, ...
CHECKPOINT = "commit"  # in a partition directory: a commit its member knew (decimal), Kafka's high watermark
SEEN = "seen"  # in a partition directory: the highest claim its member accepted (decimal, synced)
SCAN_BYTES = 4 << 20  # a log is read at start-up this much at a time


class Sync(NamedTuple):
    """fsync = interval: the shell's timer puts one in every partition's queue (a log is used
    by one worker at a time, so the sync waits its turn there)."""

    partition: int


class LogStore:
    def __init__(self, root: Path, log: Callable[..., None], settings: LogSettings, segment_bytes: int) -> None:
        self.root = root
        self.log = log  # (level, event, **fields): the member's event log
        self.settings = settings
        self.segment_bytes = segment_bytes
        self.logs: dict[int, SegmentLog] = {}
        self.checkpointed: dict[int, int] = {}  # partition -> the commit last written to its checkpoint

    def _dir(self, p: int) -> Path:
        return self.root / f"{PREFIX}{p:05d}"

    def _log(self, p: int) -> SegmentLog:
        """Partition ``p``'s log, opened (made) the first time it is used."""
        log = self.logs.get(p)
        if log is None:
            log = self.logs[p] = self._open(self._dir(p))[0]
        return log

    def _open(self, d: Path) -> tuple[SegmentLog, Any]:
        return SegmentLog.open(d, segment_bytes=self.segment_bytes)

    def open_all(self) -> LogsRead:
        """Every partition log under the root, recovered and scanned a chunk at a time (memory
        stays bounded for a large log); an error names the one that cannot be opened."""
        logs: dict[int, LogScan] = {}
        if not self.root.exists():
            return LogsRead(logs, "")
        for d in sorted(self.root.iterdir()):
            name = d.name
            if not (d.is_dir() and name.startswith(PREFIX) and name[len(PREFIX) :].isdigit()):
                continue
            p = int(name[len(PREFIX) :])
            try:
                if not any(d.glob("*.log")):  # (only a claim's promise: no log to open, no file held)
                    seen = _read_number(d / SEEN, strict=True)
                    if seen:
                        logs[p] = LogScan(0, self.settings.keep, 0, seen)
                    continue
                log, rec = self._open(d)
                scan = self._scan(log, d)
            except (LogCorrupt, LogFormatError, OSError) as exc:
                return LogsRead({}, f"{d}: {exc}")
            if rec.cut_bytes:
                self.log("warning", "log_tail_cut", partition=p, cut_at=rec.cut_at, cut_bytes=rec.cut_bytes,
                         reason=rec.cut_reason)  # fmt: skip
            self.logs[p] = log
            self.checkpointed[p] = scan.commit
            if scan.records or scan.start or scan.seen:  # (an empty log reset to a later start begins there)
                logs[p] = scan
        return LogsRead(logs, "")

    def _scan(self, log: SegmentLog, d: Path) -> LogScan:
        scan = LogScan(log.start, self.settings.keep, _read_number(d / CHECKPOINT), _read_number(d / SEEN, strict=True))
        while scan.end < log.end:
            chunk = log.read(scan.end, max_bytes=SCAN_BYTES, max_records=1 << 62)
            if not chunk:
                raise LogCorrupt(f"no record at offset {scan.end} before the end {log.end}")
            scan.feed(chunk)
        return scan

    def perform(self, a: Any) -> Any:
        """Do one disk action of the core; returns the event that answers it (None for ``Sync``)."""
        p = a.partition
        cls = a.__class__
        try:
            if cls is SaveSeen:  # (a claim answered: the promise only, no log opened for it)
                _write_number(self._dir(p) / SEEN, a.epoch, synced=True)
                return SeenSaved(p, a.epoch)
            log = self._log(p)
            if cls is Sync:
                log.sync()
                return None
            if cls is ReadLog:
                start = a.start if a.at_time < 0 else log.offset_for_time(a.at_time)
                return LogRecords(p, a.token, log.read(start, max_records=a.limit))
            if cls is Append:
                return self._append_run([a])[0]
            if cls is Retain:
                gone = log.retain(a.now_ms, a.max_bytes, a.max_age_ms, a.keep_from)
                if gone:
                    self.log("info", "log_retained", partition=p, segments=len(gone), start=log.start)
                return LogRetained(p, log.start, log.wanted)
            if cls is Reload:
                log.truncate(a.to)
                self._lower_checkpoint(p, log.end)
                return LogReloaded(p, self._scan(log, self._dir(p)))
            if cls is Truncate:
                log.truncate(a.to)
            elif cls is ResetLog:
                log.reset(a.start)
            self._lower_checkpoint(p, log.end)
            return LogWritten(p, log.end)
        except (OSError, LogUsage, LogCorrupt, LogFormatError) as exc:
            return self._failed(p, exc)

    def _lower_checkpoint(self, p: int, end: int) -> None:
        """A cut (or reset) to ``end``: a checkpoint past it would count the next branch's records
        there as committed after a restart."""
        if self.checkpointed.get(p, 0) > end:  # (what the file holds: set at open and at every write)
            _write_number(self._dir(p) / CHECKPOINT, end)
            self.checkpointed[p] = end

    def _failed(self, p: int, exc: Exception) -> LogFailed:
        self.log("error", "log_failed", partition=p, reason=str(exc)[:200])
        return LogFailed(p, str(exc)[:200])

    def perform_all(self, actions: list[Any]) -> list[Any]:
        """Do one partition's queued actions in order, with one fsync for a run of ``Append``
        actions (group commit); each is answered, a run's answers once the run is on disk."""
        out: list[Any] = []
        run: list[Any] = []  # consecutive Appends
        for a in actions:
            if a.__class__ is Append:
                run.append(a)
                continue
            if run:
                out += self._append_run(run)
                run = []
            if out and out[-1].__class__ is LogFailed:
                return out  # (the member stops: nothing more is done to this log)
            out.append(self.perform(a))
        if run and not (out and out[-1].__class__ is LogFailed):
            out += self._append_run(run)
        return out

    def _append_run(self, run: list[Any]) -> list[Any]:
        p = run[0].partition
        log = self._log(p)
        try:
            for a in run:
                log.append(a.records)
            durable = log.sync() if any(a.sync for a in run) else _flushed(log)
            commit = max(a.commit for a in run)
            if commit > self.checkpointed.get(p, -1):  # (after the records it covers are on disk)
                _write_number(self._dir(p) / CHECKPOINT, commit)
                self.checkpointed[p] = commit
        except (OSError, LogUsage, LogCorrupt) as exc:
            return [self._failed(p, exc)]
        return [LogWritten(p, durable) for _ in run]

    def close(self) -> None:
        for log in self.logs.values():
            with contextlib.suppress(OSError):
                log.close()


def _flushed(log: SegmentLog) -> int:
    log.flush()
    return log.end


def _write_number(path: Path, value: int, synced: bool = False) -> None:
    """Replaced whole. The commit checkpoint is never fsynced: after a power loss it may be older,
    or gone, and either only makes the next start believe less is committed (safe: a claim commits
    it again). A promise (the accepted claim, ``synced``) must not come back older: the file and
    its directory (and the directory's parent, if it was made now) are synced."""
    d = path.parent
    if synced and not d.exists():
        d.mkdir(parents=True)
        sync_dir(d.parent)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(f"{value}\n")
        if synced:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if synced:
        sync_dir(d)


def _read_number(path: Path, strict: bool = False) -> int:
    """The number a file holds, 0 if it is missing. Not a number: 0 for the checkpoint (nothing
    known committed); an error if ``strict`` (a promise cannot be forgotten quietly: the member
    must not answer a lower claim)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return 0
    except OSError:
        if strict:
            raise
        return 0
    if text.strip().isdigit():
        return int(text)
    if strict:
        raise LogCorrupt(f"{path} is not an epoch: {text[:40]!r}")
    return 0
