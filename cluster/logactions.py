"""What a partition log's core (cluster/partitionlog.py) is configured with and asks for (sans-IO).

``LogSettings`` are the [durable] settings the core uses (and the broken builds
it is told to be, for the simulator). The actions are what one owner's log asks
of its shell (node/segmentlog.py through cluster/logstore.py, or the simulator's
disk, sim/logs.py): disk work (``Append``, ``Truncate``, ``ResetLog``,
``ReadLog``, ``Retain``, and the disk policy's ``Sync`` and
``Checkpoint``: cluster/logdisk.py decides when), a frame for another owner
(``PeerFrame``), puts and cursors now committed (``Committed``), a reader's
records read from disk (``ReadDone``), and ``Reload`` (a cut past the cache: the shell
cuts the log and reads it again), and the leader's requests to the metadata quorum
(``AlterIsr``, ``Reelect``: cluster/controller.py decides them).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from roost.node.segmentlog import Record


class LogSettings(NamedTuple):
    """The [durable] settings a log's core uses (cluster/config.py documents each)."""

    fsync: str = "always"  # always | interval | never
    fsync_interval: float = 0.2  # fsync = interval: how long a written record may wait for its fsync
    max_uncommitted: int = 10_000
    cache_records: int = 20_000
    fetch_records: int = 500
    fetch_bytes: int = 1 << 20
    fetch_wait: float = 0.5
    fetch_retry: float = 1.0
    retention_bytes: int = 0  # 0: no limit
    retention_age: float = 604800.0
    retention_check_interval: float = 60.0
    min_insync: int = 2  # a put commits only on the leader and at least this many - 1 in-sync followers
    isr_lag_time: float = 10.0  # a follower not caught up for this long leaves the in-sync replicas
    # Deliberately broken mechanisms (sim/breaks.py: "early-ack", "no-fsync"), from the member's
    # NodeConfig.breaks: empty in every real member.
    breaks: frozenset[str] = frozenset()

    @classmethod
    def of(cls, settings: Any, breaks: frozenset[str] = frozenset()) -> LogSettings:
        """From the cluster's settings (cluster/config.py ClusterSettings: the same names) and the
        member's ``breaks`` (NodeConfig)."""
        return cls(**{k: getattr(settings, k) for k in cls._fields if k != "breaks"}, breaks=breaks)

    @property
    def keep(self) -> int:
        """Records a log opened at start-up keeps in memory (``LogScan``)."""
        return max(self.cache_records, self.max_uncommitted)


# ---------------------------------------------------------------- actions


class Append(NamedTuple):
    """``records`` to append, fsynced before the answer if ``sync`` (fsync = always)."""

    partition: int
    records: list[Record]
    sync: bool


class Sync(NamedTuple):
    """fsync the log (fsync = interval: the core asks once a written record has waited
    ``fsync_interval``); it covers every ``Append`` asked before it. Not answered: no
    acknowledgement waits for it under that policy (docs/durable.md)."""

    partition: int


class Checkpoint(NamedTuple):
    """Replace the log's commit checkpoint (a file beside it, never fsynced) with ``commit``: read
    back as ``LogScan.commit`` on the next start. Asked after the ``Append`` of the records it
    covers, and before a cut below it. Not answered."""

    partition: int
    commit: int


class Truncate(NamedTuple):
    partition: int
    to: int


class ResetLog(NamedTuple):
    partition: int
    start: int


class ReadLog(NamedTuple):
    """Records from ``start`` (at most ``limit``); with ``at_time`` >= 0, the first record whose
    time is at or after it (a durable subscription starting at a time older than the cache)."""

    partition: int
    start: int
    limit: int
    token: Any
    at_time: int = -1


class Retain(NamedTuple):
    """Delete closed segments past the retention limits, but none holding ``keep_from`` or later."""

    partition: int
    keep_from: int
    now_ms: int
    max_bytes: int
    max_age_ms: int


class PeerFrame(NamedTuple):
    member: str
    frame: list[Any]


class Committed(NamedTuple):
    partition: int
    tokens: list[Any]
    records: list[Record]


class Reload(NamedTuple):
    """Cut the log to ``to`` and read it again (answered by ``LogReloaded``): a cut below the
    records the core holds in memory, whose state (producers, cursors) it must rebuild."""

    partition: int
    to: int


class AlterIsr(NamedTuple):
    """A leader asks the quorum's controller to make ``isr`` the in-sync replicas of its partition
    (cluster/controller.py ``alter_isr``): applied only if it still leads at ``epoch`` and the
    leadership is still at ``version``."""

    partition: int
    epoch: int
    version: int
    isr: tuple[str, ...]


class Reelect(NamedTuple):
    """The quorum names us the leader at ``epoch``, an epoch we may not begin (we led it before a
    restart, or hold its records): we ask for a new epoch of ours."""

    partition: int
    epoch: int
    at_least: int = 0  # (the new epoch is above every one our log holds: a log of an older version)


class Decline(NamedTuple):
    """Our log may lack records the ISR holds (we restarted under an fsync policy that can lose
    written ones, and have not caught up since), and we are in the ISR: we tell the controller,
    with our log's end, so that it names another leader (cluster/controller.py ``decline``, when
    it names us; ``decide`` passes over us). Sent again each ``fetch_retry`` while it holds."""

    partition: int
    end: int
    last_epoch: int


class Recovered(NamedTuple):
    """Our suspect log caught up from its leader: the controller may name us again (it drops the
    report our ``Decline`` gave)."""

    partition: int


class ReadDone(NamedTuple):
    """Committed records a reader asked for (``read_committed``) that had to come from disk."""

    token: Any
    records: list[Record]


LogAction = (
    Append
    | Sync
    | Checkpoint
    | Truncate
    | ResetLog
    | ReadLog
    | Retain
    | PeerFrame
    | Committed
    | Reload
    | ReadDone
    | AlterIsr
    | Reelect
    | Decline
    | Recovered
)
