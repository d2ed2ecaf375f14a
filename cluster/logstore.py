"""A real member's durable partition logs on disk, for the trio shell (cluster/server.py).

The member core (cluster/durable.py) decides; this runs what it asks on
node/segmentlog.py, blocking, so the shell calls it in a worker thread: at
start, ``open_all`` opens every partition directory under ``<data_dir>/log``
(torn tails cut, each cut logged) and returns the ``LogsRead`` event fed before
``Start``; then ``perform`` does one ``Append``/``Truncate``/``ResetLog``/
``ReadLog`` and returns the event that answers it. The shell keeps one queue
per partition, so each partition's work is done in the order the core gave it.
An ``Append`` with ``sync`` returns only after fsync (fsync policy ``always``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster.events import LogRecords, LogsRead, LogWritten
from cluster.partitionlog import Append, ReadLog, ResetLog, Truncate
from node.segmentlog import LogCorrupt, LogUsage, SegmentLog

PREFIX = "p"  # partition directories: p00000, p00001, ...


class LogStore:
    def __init__(self, root: Path, log: Callable[..., None]) -> None:
        self.root = root
        self.log = log  # (level, event, **fields): the member's event log
        self.logs: dict[int, SegmentLog] = {}

    def _dir(self, p: int) -> Path:
        return self.root / f"{PREFIX}{p:05d}"

    def open_all(self) -> LogsRead:
        """Every partition log under the root, recovered; an error names the one that cannot be opened."""
        logs: dict[int, tuple[int, list[Any]]] = {}
        if not self.root.exists():
            return LogsRead(logs, "")
        for d in sorted(self.root.iterdir()):
            name = d.name
            if not (d.is_dir() and name.startswith(PREFIX) and name[len(PREFIX):].isdigit()):
                continue
            p = int(name[len(PREFIX):])
            try:
                log, rec = SegmentLog.open(d)
            except (LogCorrupt, OSError) as exc:
                return LogsRead({}, f"{d}: {exc}")
            if rec.cut_bytes:
                self.log("warning", "log_tail_cut", partition=p, cut_at=rec.cut_at, cut_bytes=rec.cut_bytes,
                         reason=rec.cut_reason)  # fmt: skip
            self.logs[p] = log
            records = log.read(log.start, max_bytes=1 << 62, max_records=1 << 62)
            if records:
                logs[p] = (log.start, records)
        return LogsRead(logs, "")

    def perform(self, a: Any) -> Any:
        """Do one disk action of the core; returns the event that answers it."""
        p = a.partition
        log = self.logs.get(p)
        if log is None:
            log = self.logs[p] = SegmentLog.open(self._dir(p))[0]
        cls = a.__class__
        try:
            if cls is ReadLog:
                return LogRecords(p, a.token, log.read(a.start, max_records=a.limit))
            if cls is Append:
                log.append(a.records)
                return LogWritten(p, log.sync() if a.sync else _flushed(log))
            if cls is Truncate:
                log.truncate(a.to)
            elif cls is ResetLog:
                log.reset(a.start)
            return LogWritten(p, log.end)
        except (OSError, LogUsage) as exc:
            # (the core waits for what was not written: its publishers retry elsewhere or later)
            self.log("error", "log_write_failed", partition=p, reason=str(exc)[:200])
            return LogRecords(p, a.token, []) if cls is ReadLog else LogWritten(p, 0)

    def close(self) -> None:
        for log in self.logs.values():
            with contextlib.suppress(OSError):
                log.close()


def _flushed(log: SegmentLog) -> int:
    log.flush()
    return log.end
