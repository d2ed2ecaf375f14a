"""What a durable partition log's readers, its fetchers and its retention see of it (sans-IO).

An owner answers another owner's FETCH with ``DATA`` (``answer``, ``data``): the
records from the fetcher's end out of its cache, or read from disk (``read_done``),
or where the fetcher must cut or reset its log to (cluster/partitionlog.py's theory
of operation). A leader serves durable readers (GET) only records below its commit,
and only while its read lease holds (``readable``): every follower it counts in
sync fetched from it lately, at its epoch. Retention deletes old segments of each owner's own log,
never at or past ``retain_limit`` (cluster/partitionlog.py's theory of operation
says why the newest record of each cursor is kept). A ``PartitionLog`` holds one
``Readers`` over itself (``LogView``: the state it reads, and what retention moves)
and hands these calls to it.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from roost.cluster.logactions import LogAction, LogSettings, PeerFrame, ReadDone, ReadLog
from roost.cluster.logrecords import State, diverges, last_epoch_of
from roost.node.segmentlog import Record

IDLE, FOLLOWING, LEADING = "idle", "following", "leading"
# DATA status: records (or where to cut); we do not lead at the fetch's epoch; the fetch's epoch is
# older than the one we lead
OK, NOT_LEADER, STALE = 0, 1, 2


class LogView(Protocol):
    """The log state readers and retention see (a ``PartitionLog``'s)."""

    p: int
    s: LogSettings
    role: str
    start: int
    commit: int
    base: State
    base_at: int
    isr: set[str]
    adding: set[str]
    reloading: bool
    followers: dict[str, int]
    fetched_at: dict[str, float]
    stale_until: float
    tail: deque[tuple[Record, list[Any]]]
    state: State
    epoch: int
    end: int
    epochs: list[tuple[int, int]]


class Readers:
    """A log's readers and retention, over the log's state (``view``)."""

    def __init__(self, view: LogView) -> None:
        self.v = view

    def readable(self, now: float) -> bool:
        """Whether we may serve readers (GET): we lead, and every follower we count in sync fetched
        from us within fetch_wait + fetch_retry. A leader paused or cut off while the quorum made
        another one still leads in its own view, with cursors older than those committed since; the
        new leader was in its ISR and stops fetching from it once it leads, so this lease runs out.
        With no follower in sync no other member can be made leader, so none can be newer."""
        v = self.v
        lease = v.s.fetch_wait + v.s.fetch_retry
        return (
            v.role == LEADING
            and not v.reloading
            and all(now - v.fetched_at.get(m, -1e18) <= lease for m in v.isr | v.adding)
        )

    def paused(self, now: float) -> None:
        """Our process stood still (the member noticed: ``local_pause``). Fetches that waited in
        our sockets meanwhile are read in a burst now; sent before their followers may have left
        us, they renew no read lease for ``fetch_retry``."""
        v = self.v
        v.fetched_at.clear()
        v.stale_until = now + v.s.fetch_retry

    def read_committed(self, start: int, limit: int, token: Any) -> tuple[list[Record] | None, list[LogAction]]:
        """Committed records from ``start`` (a durable reader's): from the cache, or (None and) a
        ``ReadLog`` whose answer comes back as ``ReadDone(token)``."""
        v = self.v
        start = max(start, v.start)
        if start >= v.commit:
            return [], []
        if start >= v.base_at:
            out: list[Record] = []
            for r, _ in v.tail:
                if r.offset >= v.commit or len(out) >= limit:
                    break
                if r.offset >= start:
                    out.append(r)
            return out, []
        return None, [ReadLog(v.p, start, limit, token)]

    def retain_limit(self) -> int:
        """Retention may delete only records before this: committed, and no cursor's newest record
        (none while a Reload is under way: the cursors are then not known; review)."""
        v = self.v
        if v.reloading:
            return v.start
        return min([v.commit, *v.state.cursor_at.values()])

    def retained(self, start: int) -> None:
        """Retention deleted everything before ``start`` (at most ``retain_limit``) from the disk."""
        v = self.v
        if start <= v.start:
            return
        v.start = start
        while v.tail and v.tail[0][0].offset < start:  # (committed: its state is kept in base)
            r, b = v.tail.popleft()
            v.base.apply(r.offset, b)
        v.base_at = max(v.base_at, start)

    def first_at(self, time_ms: int, token: Any) -> tuple[int | None, list[LogAction]]:
        """The first committed offset at or after ``time_ms``: from the cache, or (None and) a
        ``ReadLog`` of the record on disk, answered as ``ReadDone(token)``."""
        v = self.v
        if v.base_at <= v.start or (v.tail and v.tail[0][0].time_ms <= time_ms):  # (in the cache)
            for r, _ in v.tail:
                if r.time_ms >= time_ms:
                    return min(r.offset, v.commit), []
            return v.commit, []
        return None, [ReadLog(v.p, v.start, 1, token, time_ms)]

    # ------------------------------------------------------------ fetchers

    def answer(self, member: str, end: int, last_epoch: int | None = None, status: int = OK) -> list[LogAction]:
        """``DATA`` for ``member``'s fetch from ``end`` (its last epoch ``last_epoch``), or a
        ``ReadLog`` of records no longer in the cache (answered through ``read_done``)."""
        v = self.v
        if last_epoch is not None:
            cut = diverges(v.epochs, v.end, end, last_epoch)
            if cut is not None:
                return [self.data(member, status, end, [], truncate=cut)]
        if end < v.start:
            return [self.data(member, status, end, [], reset=v.start)]
        if end < v.base_at:
            return [ReadLog(v.p, end, v.s.fetch_records, ("fetch", member, status, v.epoch))]
        return [self.data(member, status, end, self._cached(end))]

    def _cached(self, end: int) -> list[Record]:
        v = self.v
        out: list[Record] = []
        size = 0
        for r, _ in v.tail:
            if r.offset < end:
                continue
            if len(out) >= v.s.fetch_records or (out and size + len(r.body) > v.s.fetch_bytes):
                break
            out.append(r)
            size += len(r.body)
        return out

    def read_done(self, token: Any, records: list[Record]) -> list[LogAction]:
        """A ``ReadLog`` is done: a fetcher's ``DATA``, or a reader's committed records (``ReadDone``).
        A fetch read for an epoch we no longer lead is not answered: where its log matched ours was
        judged against a log we may have cut since (the fetcher asks again)."""
        v = self.v
        if token.__class__ is tuple and token[0] == "fetch":
            if not records or v.role != LEADING or v.epoch != token[3]:
                return []
            return [self.data(token[1], token[2], records[0].offset, records)]
        return [ReadDone(token, [r for r in records if r.offset < v.commit])]

    def data(self, member: str, status: int, end: int, records: list[Record], *, truncate: int = -1,
             reset: int = -1) -> PeerFrame:  # fmt: skip
        v = self.v
        recs = [[r.offset, r.time_ms, r.body] for r in records]
        return PeerFrame(member, ["DATA", v.p, v.epoch, status, v.start, v.end, last_epoch_of(v.epochs),
                                  v.commit, truncate, reset, recs, end])  # fmt: skip
