"""What the metadata quorum's Raft core and its storage say to each other: two plain shapes.

The Raft core (cluster/raft.py) is sans-IO, so it cannot write its own term, vote, log and
snapshot: it hands its shell a ``RaftPersist`` and waits to be told ``persisted(token)`` before
it acts on what it asked to keep (answering a vote, acknowledging entries). Raft is only safe
if what it acknowledged survives a crash, so "persisted" means fsynced, never merely written.
When a member starts, its shell reads the storage back as one ``Stored`` and hands it to the
core before anything else. The real storage is cluster/raftstore.py (files under
``<data_dir>/quorum/``); the simulator's is sim/raftdisk.py, whose power loss drops what was
not synced. Both apply a ``RaftPersist`` with the same rules (``check_persist`` in
cluster/raftstore.py), so a core sees one behaviour whichever runs it.

These shapes live apart from the core and from the storage so that each side imports only
them: neither needs the other's code.
"""

from __future__ import annotations

from typing import NamedTuple


class Stored(NamedTuple):
    """What the storage held at start; all empty (zeros, None, []) for a new member.

    ``entries`` are the log's entries after the snapshot, in order: entry ``k`` of the list is
    at index ``snapshot_index + 1 + k``, as ``(term, command)``. Indexes are not repeated
    because the log is contiguous by construction: the storage refuses to hold a gap.
    """

    term: int = 0
    vote: str | None = None
    snapshot_index: int = 0  # 0: no snapshot
    snapshot_term: int = 0
    snapshot: bytes | None = None
    entries: list[tuple[int, bytes]] = []  # (term, command) for indexes snapshot_index+1, +2, ... (never mutated)


class RaftPersist(NamedTuple):
    """One request of the core to its storage, applied whole before it is answered.

    Order within one request: the snapshot is installed, then the log is cut, then the entries
    are appended, then term and vote are replaced; one fsync barrier covers all of it, and only
    then does the shell answer ``persisted(token)``. A crash before that may leave any part of
    it, or none: the core must not have acted on it.

    ``truncate_after`` cuts every entry with an index above it (the entries a new leader's log
    does not have); ``entries`` are then appended right after the log's last entry, contiguous.
    A ``snapshot`` ``(index, term, data)`` replaces the one held; the entries at or below its
    index go, and the entries above it stay only if the log's entry at ``index`` has ``term``
    (the log agrees with the snapshot, Raft's InstallSnapshot rule); otherwise the whole log goes.
    """

    token: int  # rising; the shell answers the core with persisted(token) once synced
    term: int
    vote: str | None  # term and vote: replaced whole
    truncate_after: int | None  # cut every entry with index > truncate_after first (None: no cut)
    entries: list[tuple[int, int, bytes]]  # (index, term, command) appended after the cut, contiguous
    snapshot: tuple[int, int, bytes] | None  # (index, term, data): install; entries at or below index go
    # (entries above it that the log holds and that agree stay)
