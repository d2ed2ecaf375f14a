"""The simulator's disk for the map epochs' ceiling: per member, what is synced and what is not.

It does for sim/simulation.py what cluster/epochstore.py does for a real member, in memory:
``open`` gives the ceiling a starting core reads (``LogsRead.epochs``), and each
``PersistEpochs`` the core asks for completes after a seeded delay.

Theory of operation
-------------------
A write takes time and is answered later, so each member's disk holds what is ``synced`` (what
survives a power loss; ``open`` reads it) and the writes ``queued`` behind it, in order.
``submit(member, ceiling, now)`` queues a write and returns when it completes; the simulation
schedules ``complete(member, ceiling)`` then, which syncs it (and every write before it) and
answers whether the core may be told ``EpochsPersisted``: False when a crash dropped it.
``crash(member)`` is a power loss: the queued writes are gone, as if never made. A start is a
new process: whatever its previous one had queued is dropped too (its answers must not reach
the new core; the simulation checks the member's incarnation as for every disk answer).

What the core does with it is judged by the simulation: a member must never hand out a map
whose epoch is not above every epoch it handed out in an earlier life (the ``map_published``
trace of cluster/partitionmap.py).

Nothing here decides: what to write and when to answer are the core's.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field


@dataclass
class MemberEpochDisk:
    synced: int = 0
    queued: deque[int] = field(default_factory=deque)  # submitted, not yet completed, in order
    busy_until: float = 0.0


class SimEpochDisk:
    """Every member's ceiling; a seeded ``rng`` draws how long each write takes."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.disks: dict[str, MemberEpochDisk] = {}

    def _disk(self, member: str) -> MemberEpochDisk:
        return self.disks.setdefault(member, MemberEpochDisk())

    def synced(self, member: str) -> int:
        """The ceiling on ``member``'s disk now, as a power loss would leave it."""
        return self._disk(member).synced

    def open(self, member: str) -> int:
        """What ``member``'s core reads when it starts: the ceiling synced (0: never written)."""
        self.crash(member)
        return self._disk(member).synced

    def submit(self, member: str, ceiling: int, now: float) -> float:
        """Queue a write of ``ceiling``; returns when it completes (schedule ``complete`` then)."""
        d = self._disk(member)
        d.queued.append(ceiling)
        d.busy_until = max(now, d.busy_until) + self.rng.uniform(0.0002, 0.003)
        return d.busy_until

    def complete(self, member: str, ceiling: int) -> bool:
        """The write of ``ceiling`` (and every one before it) is synced; False if a crash dropped it."""
        d = self._disk(member)
        if ceiling not in d.queued:
            return False
        while d.queued:
            c = d.queued.popleft()
            d.synced = c
            if c == ceiling:
                break
        return True

    def crash(self, member: str) -> None:
        """A power loss at ``member``: every write not completed is gone."""
        d = self._disk(member)
        d.queued.clear()
        d.busy_until = 0.0
