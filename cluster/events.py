"""What flows between the member core (cluster/member.py) and whatever runs it.

The core is sans-IO: a shell (cluster/server.py, real sockets and files) or
the simulator (sim/simulation.py, a fake network and disk) feeds it events with
the current time and performs the actions it returns. Both sides speak only
these types, so the same core runs unchanged in both.

Link ids: the core numbers the links it dials (positive ids, in ``Dial``);
the runner numbers the links it accepts (negative ids, in ``Accepted``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from roost.cluster.logrecords import LogScan
from roost.cluster.partitionlog import Append, ReadLog, Reload, ResetLog, Retain, Truncate
from roost.cluster.raftstate import RaftPersist, Stored
from roost.node.actions import Log, Send, Trace
from roost.node.segmentlog import Record

Addr = tuple[str, int]


# ---------------------------------------------------------------- events


class Start(NamedTuple):
    """The runner is listening for peers: begin syncing."""


class Tick(NamedTuple):
    """Time passed (``next_deadline`` was reached)."""


class Datagrams(NamedTuple):
    """Client datagrams that arrived on the client UDP port, in order."""

    batch: list[tuple[bytes, Addr]]


class Accepted(NamedTuple):
    """A peer dialled us; ``link`` is the runner's (negative) id for it."""

    link: int
    remote: str


class LinkOpened(NamedTuple):
    """A ``Dial`` succeeded: the TCP connection is up (not yet authenticated)."""

    link: int


class LinkBytes(NamedTuple):
    link: int
    data: bytes


class LinkSent(NamedTuple):
    """``nbytes`` of the link's ``SendFrame`` data went to the kernel: the
    core streams a large answer (cluster/dumps.py) only as fast as a link
    drains, never into an ever-growing queue in the runner."""

    link: int
    nbytes: int


class LinkClosed(NamedTuple):
    """The connection ended (EOF, error, failed dial); the runner has closed it."""

    link: int
    reason: str


class SnapshotRead(NamedTuple):
    """Answer to ``ReadSnapshot``: the file's bytes, or None with a reason."""

    data: bytes | None
    reason: str


class PersistDone(NamedTuple):
    """Answer to ``WriteSnapshot``: the file and its directory are fsynced (or
    ``error`` says why not)."""

    token: int
    error: str | None


class Stop(NamedTuple):
    """Shut down: write a last snapshot, then ``Exit``."""


class LogsRead(NamedTuple):
    """Fed before ``Start``: each durable partition log the runner found on disk (torn
    tails cut), read through a ``LogScan`` (cluster/logrecords.py), or ``error`` (a log
    that cannot be opened). Then ``Append``, ``Truncate``, ``ResetLog``, ``ReadLog`` and
    ``Retain`` actions (cluster/partitionlog.py) change and read one partition's log, in
    the order given, off the event loop, answered by ``LogWritten``, ``LogRecords`` and
    ``LogRetained``; ``Reload`` (a cut below what the core holds in memory) by ``LogReloaded``."""

    logs: dict[int, LogScan]
    error: str
    quorum: Stored | None = None  # the metadata quorum's Raft state as stored (cluster/raftstore.py)
    epochs: int | None = None  # the map epochs' ceiling stored in earlier lives (cluster/epochstore.py; None: no store)


class LogRetained(NamedTuple):
    """Answer to ``Retain``: the log now starts at ``start``; without its ``keep_from``
    retention would have gone to ``wanted``."""

    partition: int
    start: int
    wanted: int


class LogWritten(NamedTuple):
    """An ``Append``, ``Truncate`` or ``ResetLog`` of ``partition`` is done: its
    records before ``durable`` are on disk (by the fsync policy)."""

    partition: int
    durable: int


class LogFailed(NamedTuple):
    """A disk action of ``partition`` failed (a write, a sync, a retention, or a read that found a
    damaged record): what the log holds on disk is no longer what its core believes."""

    partition: int
    reason: str


class RaftPersisted(NamedTuple):
    """Answer to ``RaftPersist``: the quorum's state up to ``token`` is on disk (synced), or
    ``error`` (the disk failed: the member stops)."""

    token: int
    error: str = ""


class EpochsPersisted(NamedTuple):
    """Answer to ``PersistEpochs``: ``ceiling`` is on disk (synced), or ``error`` (the member stops)."""

    ceiling: int
    error: str = ""


class LogReloaded(NamedTuple):
    """Answer to ``Reload``: the partition's log, cut and read again."""

    partition: int
    scan: LogScan


class LogRecords(NamedTuple):
    """Answer to ``ReadLog``."""

    partition: int
    token: object
    records: list[Record]


Event = (
    Start
    | Tick
    | Datagrams
    | Accepted
    | LinkOpened
    | LinkBytes
    | LinkSent
    | LinkClosed
    | SnapshotRead
    | PersistDone
    | Stop
    | LogsRead
    | LogWritten
    | LogRecords
    | LogRetained
    | LogFailed
    | LogReloaded
    | RaftPersisted
    | EpochsPersisted
)


# ---------------------------------------------------------------- actions


class SendFrame(NamedTuple):
    """Bytes for a peer link (one or more encoded frames), in order."""

    link: int
    data: bytes


class Dial(NamedTuple):
    link: int
    peer: str
    addr: Addr


class Close(NamedTuple):
    link: int
    why: str


class ServeClients(NamedTuple):
    """Synced: bind the client UDP port and start passing ``Datagrams``."""


class ReadSnapshot(NamedTuple):
    """Read the snapshot file (in a worker thread) and answer ``SnapshotRead``."""


class WriteSnapshot(NamedTuple):
    """Write ``chunks`` to a temporary file, fsync it, rename it over the
    snapshot, fsync the directory, then report ``PersistDone(token)``. The
    chunks are produced lazily from live state: take them on the event loop
    (between checkpoints), write them off it."""

    token: int
    chunks: Iterator[bytes]


class PersistEpochs(NamedTuple):
    """Partitioned mode: write the map epochs' ceiling (cluster/epochstore.py), fsynced, then
    answer ``EpochsPersisted(ceiling)``. One at a time: the core asks again only once answered."""

    ceiling: int


class Exit(NamedTuple):
    """Stopping is complete; ``error``: the member cannot run (the process exits 2 with it)."""

    error: str = ""


Action = (
    Send
    | Log
    | SendFrame
    | Dial
    | Close
    | ServeClients
    | ReadSnapshot
    | WriteSnapshot
    | Exit
    | Append
    | Truncate
    | ResetLog
    | ReadLog
    | Retain
    | Reload
    | RaftPersist
    | PersistEpochs
    | Trace
)

__all__ = [
    "Accepted",
    "Action",
    "Addr",
    "Append",
    "Close",
    "Datagrams",
    "Dial",
    "EpochsPersisted",
    "Event",
    "Exit",
    "LinkBytes",
    "LinkClosed",
    "LinkOpened",
    "LinkSent",
    "Log",
    "LogFailed",
    "LogRecords",
    "LogReloaded",
    "LogRetained",
    "LogWritten",
    "LogsRead",
    "PersistDone",
    "PersistEpochs",
    "RaftPersist",
    "RaftPersisted",
    "ReadLog",
    "ReadSnapshot",
    "Reload",
    "ResetLog",
    "Retain",
    "Send",
    "SendFrame",
    "ServeClients",
    "SnapshotRead",
    "Start",
    "Stop",
    "Stored",
    "Tick",
    "Trace",
    "Truncate",
    "WriteSnapshot",
]  # fmt: skip
