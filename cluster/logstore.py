"""A real member's durable partition logs on disk, for the trio shell (cluster/server.py).

The member core (cluster/durable.py) decides; this runs what it asks on
node/segmentlog.py, blocking, so the shell calls it in a worker thread: at
start, ``open_all`` opens every partition directory under ``<data_dir>/log``
(torn tails cut, each cut logged) and returns the ``LogsRead`` event fed before
``Start``; then ``perform`` does one ``Append``/``Truncate``/``ResetLog``/
``ReadLog``/... and returns the event that answers it. The shell keeps one
queue per partition, so each partition's work is done in the order the core
gave it. Nothing here decides when to fsync or what the commit checkpoint says
(the log core's cluster/logdisk.py does): an ``Append`` with ``sync`` is
answered only after fsync, a ``Sync`` fsyncs, a ``Checkpoint`` replaces the
checkpoint file with the number it carries.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from roost.cluster.events import LogFailed, LogRecords, LogReloaded, LogRetained, LogsRead, LogWritten
from roost.cluster.logrecords import LogFormatError, LogScan
from roost.cluster.partitionlog import (
    Append,
    Checkpoint,
    LogSettings,
    ReadLog,
    Reload,
    ResetLog,
    Retain,
    Sync,
    Truncate,
)
from roost.node.segmentlog import LogCorrupt, LogUsage, SegmentLog

PREFIX = "p"  # partition directories: p00000, p00001, ...
CHECKPOINT = "commit"  # in a partition directory: a commit its member knew (decimal), Kafka's high watermark
SCAN_BYTES = 4 << 20  # a log is read at start-up this much at a time


class LogStore:
    def __init__(self, root: Path, log: Callable[..., None], settings: LogSettings, segment_bytes: int) -> None:
        self.root = root
        self.log = log  # (level, event, **fields): the member's event log
        self.settings = settings
        self.segment_bytes = segment_bytes
        self.logs: dict[int, SegmentLog] = {}

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
                if not any(d.glob("*.log")):  # (no log to open, no file held)
                    continue
                log, rec = self._open(d)
                scan = self._scan(log, d)
            except (LogCorrupt, LogFormatError, OSError) as exc:
                return LogsRead({}, f"{d}: {exc}")
            if rec.cut_bytes:
                self.log("warning", "log_tail_cut", partition=p, cut_at=rec.cut_at, cut_bytes=rec.cut_bytes,
                         reason=rec.cut_reason)  # fmt: skip
            self.logs[p] = log
            if scan.records or scan.start:  # (an empty log reset to a later start begins there)
                logs[p] = scan
        return LogsRead(logs, "")

    def _scan(self, log: SegmentLog, d: Path) -> LogScan:
        scan = LogScan(log.start, self.settings.keep, _read_number(d / CHECKPOINT))
        while scan.end < log.end:
            chunk = log.read(scan.end, max_bytes=SCAN_BYTES, max_records=1 << 62)
            if not chunk:
                raise LogCorrupt(f"no record at offset {scan.end} before the end {log.end}")
            scan.feed(chunk)
        return scan

    def perform(self, a: Any) -> Any:
        """Do one disk action of the core; returns the event that answers it (None for ``Sync`` and
        ``Checkpoint``)."""
        p = a.partition
        cls = a.__class__
        try:
            log = self._log(p)
            if cls is Sync:
                log.sync()
                return None
            if cls is Checkpoint:
                _write_number(self._dir(p) / CHECKPOINT, a.commit)
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
                return LogReloaded(p, self._scan(log, self._dir(p)))
            if cls is Truncate:
                log.truncate(a.to)
            elif cls is ResetLog:
                log.reset(a.start)
            return LogWritten(p, log.end)
        except (OSError, LogUsage, LogCorrupt, LogFormatError) as exc:
            return self._failed(p, exc)

    def _failed(self, p: int, exc: Exception) -> LogFailed:
        self.log("error", "log_failed", partition=p, reason=str(exc)[:200])
        return LogFailed(p, str(exc)[:200])

    def perform_all(self, actions: list[Any]) -> list[Any]:
        """Do one partition's queued actions in order, with one fsync for a run of ``Append``
        actions (group commit); each is answered, a run's answers once the run is on disk. The
        ``Checkpoint`` actions among them go with the run: its last is written after the run's
        records (each follows the records it covers)."""
        out: list[Any] = []
        run: list[Any] = []  # consecutive Appends (and the Checkpoints between them)
        for a in actions:
            if a.__class__ is Append or (run and a.__class__ is Checkpoint):
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
        appends = [a for a in run if a.__class__ is Append]
        checkpoints = [a for a in run if a.__class__ is Checkpoint]
        try:
            for a in appends:
                log.append(a.records)
            durable = log.sync() if any(a.sync for a in appends) else _flushed(log)
            if checkpoints:  # (after the records it covers are written)
                _write_number(self._dir(p) / CHECKPOINT, checkpoints[-1].commit)
        except (OSError, LogUsage, LogCorrupt) as exc:
            return [self._failed(p, exc)]
        return [LogWritten(p, durable) for _ in appends]

    def close(self) -> None:
        for log in self.logs.values():
            with contextlib.suppress(OSError):
                log.close()


def _flushed(log: SegmentLog) -> int:
    log.flush()
    return log.end


def _write_number(path: Path, value: int) -> None:
    """Replaced whole, never fsynced: after a power loss the commit checkpoint may be older, or gone,
    and either only makes the next start believe less is committed (safe: the leader and its
    followers' fetches commit it again)."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(f"{value}\n")
    os.replace(tmp, path)


def _read_number(path: Path) -> int:
    """The number a file holds; 0 if it is missing, unreadable or not a number (nothing known
    committed)."""
    try:
        text = path.read_text()
    except OSError:
        return 0
    return int(text) if text.strip().isdigit() else 0
