"""What a durable partition log's readers and its retention see of it (sans-IO).

A leader serves durable readers (GET) only records below its commit, and only
while its read lease holds (``readable``): every follower in its map fetched
from it lately. Retention deletes old segments of each owner's own log, never
at or past ``retain_limit`` (cluster/partitionlog.py's theory of operation
says why the newest record of each cursor is kept). A mixin of
``PartitionLog``, which holds the state.
"""

from __future__ import annotations

from typing import Any

from roost.cluster.logactions import LogAction, LogSettings, ReadLog
from roost.cluster.logrecords import Held, State
from roost.node.segmentlog import Record

IDLE, FOLLOWING, CLAIMING, LEADING = "idle", "following", "claiming", "leading"


class Readers(Held):
    p: int
    s: LogSettings
    role: str
    start: int
    commit: int
    base: State
    base_at: int
    alone: bool
    reloading: bool
    followers: dict[str, int]
    fetched_at: dict[str, float]
    stale_until: float

    def readable(self, now: float) -> bool:
        """Whether we may serve readers (GET): we lead, and every follower in our map fetched from
        us within fetch_wait + fetch_retry. A leader paused or cut off while another member claimed
        the partition still leads in its own view, with cursors older than those committed since;
        its follower stops fetching from it once it follows the other, so this lease runs out."""
        lease = self.s.fetch_wait + self.s.fetch_retry
        return (
            self.role == LEADING
            and not self.reloading
            and bool(self.followers or self.alone)
            and all(now - self.fetched_at.get(m, -1e18) <= lease for m in self.followers)
        )

    def paused(self, now: float) -> None:
        """Our process stood still (the member noticed: ``local_pause``). Fetches that waited in
        our sockets meanwhile are read in a burst now; sent before their followers may have left
        us, they renew no read lease for ``fetch_retry``."""
        self.fetched_at.clear()
        self.stale_until = now + self.s.fetch_retry

    def read_committed(self, start: int, limit: int, token: Any) -> tuple[list[Record] | None, list[LogAction]]:
        """Committed records from ``start`` (a durable reader's): from the cache, or (None and) a
        ``ReadLog`` whose answer comes back as ``ReadDone(token)``."""
        start = max(start, self.start)
        if start >= self.commit:
            return [], []
        if start >= self.base_at:
            out: list[Record] = []
            for r, _ in self.tail:
                if r.offset >= self.commit or len(out) >= limit:
                    break
                if r.offset >= start:
                    out.append(r)
            return out, []
        return None, [ReadLog(self.p, start, limit, token)]

    def retain_limit(self) -> int:
        """Retention may delete only records before this: committed, and no cursor's newest record
        (none while a Reload is under way: the cursors are then not known; review)."""
        if self.reloading:
            return self.start
        return min([self.commit, *self.state.cursor_at.values()])

    def retained(self, start: int) -> None:
        """Retention deleted everything before ``start`` (at most ``retain_limit``) from the disk."""
        if start <= self.start:
            return
        self.start = start
        while self.tail and self.tail[0][0].offset < start:  # (committed: its state is kept in base)
            r, b = self.tail.popleft()
            self.base.apply(r.offset, b)
        self.base_at = max(self.base_at, start)

    def first_at(self, time_ms: int, token: Any) -> tuple[int | None, list[LogAction]]:
        """The first committed offset at or after ``time_ms``: from the cache, or (None and) a
        ``ReadLog`` of the record on disk, answered as ``ReadDone(token)``."""
        if self.base_at <= self.start or (self.tail and self.tail[0][0].time_ms <= time_ms):  # (in the cache)
            for r, _ in self.tail:
                if r.time_ms >= time_ms:
                    return min(r.offset, self.commit), []
            return self.commit, []
        return None, [ReadLog(self.p, self.start, 1, token, time_ms)]
