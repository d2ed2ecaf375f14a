"""The simulator's disk for the metadata quorum's Raft state: per member, what is synced and what is not.

It does for sim/simulation.py what cluster/raftstore.py does for a real member, in memory:
``open`` gives the ``Stored`` a starting core reads, and each ``RaftPersist`` the core asks for
is applied with the same rules (``check_persist``, so a request the real store would refuse
raises the same ``RaftStoreError`` here, at once, where the simulation can report it).

Theory of operation
-------------------
A persist takes time and is answered later, so each member's disk holds two states:

- ``synced``: what survives a power loss; ``open`` reads it.
- ``written``: ``synced`` with every submitted persist applied; the next persist is checked
  against it (as the real store checks against what it wrote before).

``submit(member, action, now)`` checks the persist, applies it to ``written``, queues it and
returns when it completes: ``now`` plus a seeded delay, after the member's previous persists
(one member's disk works in order). The simulation schedules ``complete(member, token)`` then:
that persist and every one before it are applied to ``synced``, and only then may the core be
told ``persisted(token)``. ``crash(member)`` is a power loss: the queued persists are gone, as
if never written, and ``written`` is ``synced`` again. A completion scheduled before the crash
must not reach the restarted core (its tokens may start again from 1): the simulation checks
the member's incarnation, as it does for every disk answer, and ``complete`` answers False for
a token it does not hold.

Nothing here decides: what to persist and when to answer are the core's.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from roost.cluster.raftstate import RaftPersist, Stored
from roost.cluster.raftstore import check_persist


@dataclass
class RaftState:
    """One member's Raft state, as a store holds it: term, vote, snapshot, the entries after it."""

    term: int = 0
    vote: str | None = None
    snapshot: tuple[int, int, bytes] | None = None  # (index, term, data)
    entries: list[tuple[int, bytes]] = field(default_factory=list)  # (term, command) from snapshot index + 1

    @property
    def snapshot_index(self) -> int:
        return self.snapshot[0] if self.snapshot is not None else 0

    @property
    def snapshot_term(self) -> int:
        return self.snapshot[1] if self.snapshot is not None else 0

    @property
    def end(self) -> int:
        """The index the next entry gets."""
        return self.snapshot_index + 1 + len(self.entries)

    def term_at(self, index: int) -> int | None:
        if index == self.snapshot_index:
            return self.snapshot_term
        k = index - self.snapshot_index - 1
        return self.entries[k][0] if 0 <= k < len(self.entries) else None

    def stored(self) -> Stored:
        data = self.snapshot[2] if self.snapshot is not None else None
        return Stored(self.term, self.vote, self.snapshot_index, self.snapshot_term, data, list(self.entries))

    def copy(self) -> RaftState:
        return RaftState(self.term, self.vote, self.snapshot, list(self.entries))

    def apply(self, a: RaftPersist, where: str) -> None:
        """``a`` applied as cluster/raftstore.py applies it (``RaftStoreError`` if it breaks a rule)."""
        check_persist(a, term=self.term, vote=self.vote, snapshot_index=self.snapshot_index,
                      snapshot_term=self.snapshot_term, end=self.end, term_at=self.term_at, where=where)  # fmt: skip
        if a.snapshot is not None:
            index = a.snapshot[0]
            keep = self.entries[index - self.snapshot_index :] if self.term_at(index) == a.snapshot[1] else []
            self.snapshot, self.entries = a.snapshot, keep
        if a.truncate_after is not None:
            del self.entries[max(0, a.truncate_after - self.snapshot_index) :]
        self.entries.extend((t, c) for _, t, c in a.entries)
        self.term, self.vote = a.term, a.vote


@dataclass
class MemberRaftDisk:
    synced: RaftState = field(default_factory=RaftState)
    written: RaftState = field(default_factory=RaftState)
    queued: deque[RaftPersist] = field(default_factory=deque)  # submitted, not yet completed, in order
    busy_until: float = 0.0


class SimRaftDisk:
    """Every member's Raft storage; a seeded ``rng`` draws how long each persist takes."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.disks: dict[str, MemberRaftDisk] = {}

    def _disk(self, member: str) -> MemberRaftDisk:
        return self.disks.setdefault(member, MemberRaftDisk())

    def open(self, member: str) -> Stored:
        """What ``member``'s core reads when it starts: what was synced. A start is a new
        process: whatever its previous one had queued is dropped, as by ``crash``."""
        self.crash(member)
        return self._disk(member).synced.stored()

    def submit(self, member: str, a: RaftPersist, now: float) -> float:
        """Queue ``a`` for ``member``; returns when it completes (schedule ``complete`` then)."""
        d = self._disk(member)
        d.written.apply(a, f"sim disk of {member}")
        d.queued.append(a)
        d.busy_until = max(now, d.busy_until) + self.rng.uniform(0.0002, 0.003)
        return d.busy_until

    def complete(self, member: str, token: int) -> bool:
        """The persist ``token`` (and every one queued before it) is synced; False if it is not
        queued (a crash dropped it): then the core must not hear of it."""
        d = self._disk(member)
        if not any(a.token == token for a in d.queued):
            return False
        while True:
            a = d.queued.popleft()
            d.synced.apply(a, f"sim disk of {member}")
            if a.token == token:
                return True

    def crash(self, member: str) -> list[int]:
        """A power loss at ``member``: every persist not completed is gone; returns their tokens."""
        d = self._disk(member)
        gone = [a.token for a in d.queued]
        d.queued.clear()
        d.written = d.synced.copy()
        d.busy_until = 0.0
        return gone
