"""When one owner's partition log is fsynced, and what its commit checkpoint says (sans-IO).

Theory of operation (docs/durable.md, "Settings and the fsync policy")
----------------------------------------------------------------------
A ``PartitionLog`` (cluster/partitionlog.py) holds one of these and asks it for
the disk actions around its writes; the shells (cluster/logstore.py, the
simulator's sim/logs.py) only store what they are told and say when it is done.

* ``always``: every ``Append`` is fsynced before its answer (``sync``), so the
  log's ``durable`` point (what a follower's fetch and a leader's commit count)
  is only ever what an fsync covered.
* ``interval``: appends are written, not synced, and counted durable once
  written (a crash of the process loses nothing: the page cache has them). The
  first ``Append`` answered after the last ``Sync`` starts the clock: at most
  ``fsync_interval`` later the core asks a ``Sync``, which the shell runs in
  the log's queue after every write asked before it. A log opened at start
  is synced at the first tick (a process that died left its writes unsynced).
  A power loss of the owners within that interval can lose an acknowledged
  record.
* ``never``: written only; the operating system syncs when it likes.

The commit checkpoint (Kafka's high-watermark file) is a commit this owner
knew. It is asked (``Checkpoint``) after each ``Append`` when the commit has
grown since the last one, so it follows the records it covers, and before a
cut (``Truncate``, ``ResetLog``, ``Reload``) below it: a checkpoint past a cut
would count the next branch's records there as committed after a restart. It
is never fsynced: an older one, or none, only makes the next start believe
less is committed (a claim commits it again).

A broken build (``no-fsync`` in ``LogSettings.breaks``, the simulator's) syncs
nothing whatever the policy says, and still counts written records durable.
"""

from __future__ import annotations

import math

from roost.cluster.logactions import Append, Checkpoint, LogAction, LogSettings, Sync
from roost.node.segmentlog import Record


class DiskPolicy:
    """One partition log's fsync and checkpoint decisions."""

    def __init__(self, partition: int, settings: LogSettings) -> None:
        self.p = partition
        fsync = "never" if "no-fsync" in settings.breaks else settings.fsync
        self.always = fsync == "always"
        self.interval = settings.fsync_interval if fsync == "interval" else math.inf
        self.checkpointed = 0  # the commit the checkpoint holds (as read at start, then as asked)
        self.unsynced = False  # interval: an Append was asked since the last Sync
        self.sync_due = math.inf  # interval: when the next Sync is asked

    def recovered(self, checkpoint: int) -> None:
        """The log as opened (or read again): its checkpoint holds ``checkpoint``. Under
        ``interval`` what it holds may be written and not synced (the process, not the machine,
        went down): it is synced at the first tick."""
        self.checkpointed = checkpoint
        if self.interval < math.inf:
            self.unsynced, self.sync_due = True, 0.0

    def append(self, records: list[Record], commit: int) -> list[LogAction]:
        """The actions that write ``records``, the log's commit being ``commit``."""
        out: list[LogAction] = [Append(self.p, records, self.always)]
        if self.interval < math.inf:
            self.unsynced = True
        if commit > self.checkpointed:  # (after the records it covers: the shell keeps the order)
            self.checkpointed = commit
            out.append(Checkpoint(self.p, commit))
        return out

    def cut(self, to: int) -> list[LogAction]:
        """What goes before a cut of the log to ``to`` (a truncation, a reset or a reload)."""
        if self.checkpointed <= to:
            return []
        self.checkpointed = to
        return [Checkpoint(self.p, to)]

    def written(self, now: float) -> None:
        """An ``Append`` was answered at ``now``: an unsynced write starts the interval's clock."""
        if self.unsynced and self.sync_due == math.inf:
            self.sync_due = now + self.interval

    def tick(self, now: float) -> list[LogAction]:
        if now < self.sync_due:
            return []
        self.sync_due, self.unsynced = math.inf, False
        return [Sync(self.p)]

    def next_deadline(self) -> float:
        return self.sync_due
