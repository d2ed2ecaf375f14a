"""The simulator's disk for durable partition logs: per member, per partition, records and a synced mark.

It does for sim/simulation.py what node/segmentlog.py does for a real member:
appends, truncations, resets and reads, in order, each answered after a
seeded delay. A crash of the member is a power loss: every record after the
synced mark is gone, as on a machine whose page cache died with it. It decides
nothing: ``sync`` appends (fsync = always) and ``Sync`` (fsync = interval) move
the mark, a ``Checkpoint`` replaces the commit checkpoint, as the log core
(cluster/logdisk.py) asks; ``Sync`` and ``Checkpoint`` are not answered (None).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from roost.cluster.events import LogRecords, LogReloaded, LogRetained, LogsRead, LogWritten
from roost.cluster.logrecords import LogScan
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
from roost.node.segmentlog import Record


@dataclass
class SimLog:
    start: int = 0
    records: list[Record] = field(default_factory=list)
    synced: int = 0  # records[:synced] survive a power loss
    checkpoint: int = 0  # the commit checkpoint (kept through a power loss: its worst case, the highest)
    written: list[float] = field(default_factory=list)  # when each record's Append was answered

    def cut(self, n: int) -> None:
        """Keep only the first ``n`` records."""
        del self.records[n:]
        del self.written[n:]
        self.synced = min(self.synced, n)

    @property
    def end(self) -> int:
        return self.start + len(self.records)


class SimLogDisk:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.logs: dict[str, dict[int, SimLog]] = {}
        self.busy_until: dict[str, float] = {}  # (one member's disk work is done in order)

    def perform(self, member: str, a: Any, now: float) -> tuple[float, Any]:
        """Do ``a`` for ``member``; returns (when its answer comes, the answer event or None)."""
        logs = self.logs.setdefault(member, {})
        cls = a.__class__
        if cls is Sync or cls is Checkpoint:  # (done at once, in order, not answered: no delay drawn)
            log = logs.setdefault(a.partition, SimLog())
            if cls is Sync:
                log.synced = len(log.records)
            else:
                log.checkpoint = a.commit
            return now, None
        at = max(now, self.busy_until.get(member, 0.0)) + self.rng.uniform(0.0002, 0.003)
        self.busy_until[member] = at
        if cls is ReadLog:
            log = logs.get(a.partition, SimLog())
            i = max(0, a.start - log.start)
            if a.at_time >= 0:
                i = next((j for j, r in enumerate(log.records) if r.time_ms >= a.at_time), len(log.records))
            return at, LogRecords(a.partition, a.token, log.records[i : i + a.limit])
        log = logs.setdefault(a.partition, SimLog())
        if cls is Append:
            assert a.records[0].offset == log.end, (member, a.partition, a.records[0].offset, log.end)
            log.records.extend(a.records)
            log.written.extend([at] * len(a.records))
            if a.sync:
                log.synced = len(log.records)
        elif cls is Truncate or cls is Reload:
            log.cut(max(0, a.to - log.start))
            if cls is Reload:
                scan = LogScan.of(log.start, log.records, LogSettings().keep, log.checkpoint)
                return at, LogReloaded(a.partition, scan)
        elif cls is ResetLog:
            log.start, log.records, log.written, log.synced = a.start, [], [], 0
        elif cls is Retain:  # (record by record: the simulated disk has no segments)
            wanted = log.start
            for r in log.records:
                if not (r.time_ms < a.now_ms - a.max_age_ms or (log.end - wanted) * 100 > a.max_bytes):
                    break
                wanted = r.offset + 1
            gone = max(0, min(wanted, a.keep_from) - log.start)
            del log.records[:gone]
            del log.written[:gone]
            log.start += gone
            log.synced = max(0, log.synced - gone)
            return at, LogRetained(a.partition, log.start, wanted)
        return at, LogWritten(a.partition, log.end)

    def read_all(self, member: str) -> LogsRead:
        logs = self.logs.get(member, {})
        keep = LogSettings().keep
        return LogsRead({p: LogScan.of(log.start, log.records, keep, log.checkpoint)
                         for p, log in logs.items() if log.records or log.start}, "")  # fmt: skip

    def power_loss(self, member: str) -> list[tuple[int, Record, float]]:
        """``member``'s machine lost power: what was not synced is gone. Returns what went
        (partition, record, when its Append was answered): fsync = interval loses some."""
        gone: list[tuple[int, Record, float]] = []
        for p, log in self.logs.get(member, {}).items():
            gone += [(p, r, t) for r, t in zip(log.records[log.synced :], log.written[log.synced :], strict=True)]
            log.cut(log.synced)
        self.busy_until.pop(member, None)
        return gone
