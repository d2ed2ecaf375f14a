"""The Raft core's settings and the actions it asks of its shell (cluster/raftstate.py: what it reads
at start and asks to persist).

The core (cluster/raft.py) decides; the shell runs these actions in order: sends,
synced writes (``RaftPersist``, answered by ``persisted(token)``), and what the
host's state machine must do (``RaftApply``, ``RaftRestore``,
``RaftSnapshotWanted``). They are types only, so a shell and its tests can name
them without the core's state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from roost.cluster.raftstate import RaftPersist, Stored
from roost.cluster.raftwire import MAX_COMMAND_BYTES, RaftMessage

__all__ = ["RaftAction", "RaftApply", "RaftPersist", "RaftRestore", "RaftRoleChanged", "RaftSend", "RaftSettings",
           "RaftSnapshotWanted", "Stored"]  # fmt: skip


@dataclass(frozen=True)
class RaftSettings:
    election_timeout: float = 1.0  # a follower campaigns after a random time in [t, 2t) without a leader
    heartbeat_interval: float = 0.1  # leader's AppendEntries to every peer at least this often
    max_append_entries: int = 256  # entries per AppendEntries
    max_append_bytes: int = 1 << 20  # bytes of commands per AppendEntries (at least one entry always goes)
    max_command_bytes: int = 1 << 16  # a longer command is refused by propose() and by the decoder
    snapshot_entries: int = 1000  # a snapshot is asked for once this many entries are applied past the last one

    def __post_init__(self) -> None:
        """Heartbeats well inside the election timeout, or a healthy leader looks dead (and its lease is short)."""
        if not 0 < self.heartbeat_interval < self.election_timeout:
            raise ValueError("raft: 0 < heartbeat_interval < election_timeout")
        if min(self.max_append_entries, self.max_append_bytes, self.max_command_bytes, self.snapshot_entries) < 1:
            raise ValueError("raft: the limits must be positive")
        if self.max_command_bytes > MAX_COMMAND_BYTES:
            raise ValueError(f"raft: max_command_bytes above what the decoder takes ({MAX_COMMAND_BYTES})")


class RaftSend(NamedTuple):
    to: str
    msg: RaftMessage


class RaftApply(NamedTuple):
    index: int  # type: ignore[assignment]  # (shadows tuple.index)
    command: bytes


class RaftRestore(NamedTuple):
    index: int  # type: ignore[assignment]  # (shadows tuple.index)
    data: bytes


class RaftSnapshotWanted(NamedTuple):
    index: int  # type: ignore[assignment]  # (shadows tuple.index)


class RaftRoleChanged(NamedTuple):
    role: str
    term: int
    leader: str | None


RaftAction = RaftSend | RaftPersist | RaftApply | RaftRestore | RaftSnapshotWanted | RaftRoleChanged
