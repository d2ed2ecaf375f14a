"""A durable partition's log as one of its owners runs it: offsets, commit, leader epochs (sans-IO).

Theory of operation (docs/durable.md)
-------------------------------------
Durable messages of a topic go to the log of the topic's partition, kept by the
partition's owners in the cluster map: the primary leads, the secondary follows.
This object is one owner's view of one partition. It does no I/O: it asks for
appends, truncations and reads (``Append``, ``Truncate``, ``ResetLog``,
``ReadLog``) that a shell runs on node/segmentlog.py in a worker thread, and is
told when they are done (``appended``, ``read_done``); what it says to the other
owners is a ``PeerFrame``; a put or a cursor commit it has made durable comes
back as a token in ``Committed``. When its log is fsynced and what its commit
checkpoint says are decided by its ``DiskPolicy`` (cluster/logdisk.py: ``Sync``
and ``Checkpoint`` actions, the fsync policy driven by ``now`` and
``next_deadline``); its readers and retention are a ``Readers``
(cluster/logreaders.py) over its state.

Records (cluster/logrecords.py). A body is msgpack ``[epoch, kind, ...]``:
``MESSAGE`` (topic, key, tags, payload, producer id, producer sequence),
``CURSOR`` (client id, subscription name, next offset) and ``EPOCH`` (written by
a leader when it begins: the log itself holds where each leader epoch starts).

Three points. ``end``: the next offset. ``durable``: the end that is on disk
here by the fsync policy (``always``: synced; otherwise written). ``commit``:
what every owner has on disk; a follower fetches from offset X only once
everything before X is durable with it, so the leader's commit is the least of
its own ``durable`` and its followers' last fetch offsets. A put is acknowledged
(``Committed``) once the commit passes it, and readers are served only what
lies below the commit: a leader that dies cannot take an acknowledged record
with it, because its follower has it on disk too.

Following is pulled (Kafka's design): the follower sends ``FETCH [p, epoch,
end, last epoch of its log, claim]`` and the leader answers ``DATA`` with the
records from ``end``, holding a fetch with nothing to give for ``fetch_wait``.
A follower whose log diverges (it has records of an epoch that ended earlier
on the leader) is told to truncate to where that epoch ended on the leader
(``end_for_epoch``, Kafka's OffsetsForLeaderEpoch); one whose end is before the
leader's start (retention) resets to it.

Leading. A member that becomes primary first claims the partition: it picks an
epoch above every one it knows of and sends a claiming FETCH to the other
owners (and to the previous owners still live, which the member core names).
An owner that accepts a claim never again follows or serves a lower epoch, and
steps down if it led at a lower one (its pending puts are never acknowledged:
their publishers retry at the new leader, and the idempotent producer stores
each once). The claimer takes the longest log of the highest last epoch among
the answers (its own included), copies what it lacks from that owner through
the same FETCH, then writes ``EPOCH`` and leads. A record acknowledged under an
older leader was on disk on every owner of that leader, and one of them is
among those the claimer hears (unless both owners were lost at once:
docs/durable.md says what is not promised).

Producers and cursors. The state a record changes (a producer's last sequence,
a cursor) is kept as ``base`` (through ``base_at``) plus ``state`` (through
``end``). The tail since ``base_at`` stays in memory: a truncation rebuilds
``state`` from ``base`` and the tail. Records fold into ``base`` once
committed and more than ``cache_records`` behind the end; a leader refuses puts
while ``max_uncommitted`` records wait for the commit, so no owner ever holds a
longer uncommitted tail, and no truncation goes past the cache (if one would,
``Reload`` has the shell cut the log and read it again: until then puts, cursor
commits and reads wait, the state there being unknown).

Retention. Every owner deletes old segments of its own log (``Retain``, run by
the shell on node/segmentlog.py), never at or past ``retain_limit``: the commit,
and the newest record of every cursor. The shell answers with the new start and
with where retention would have reached without that limit; a leader then
writes the cursors whose newest record lies below that again at the end of the
log (``refresh_cursors``), so the next round can go on without losing a durable
subscription. A follower left before the leader's start resets to it.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from roost.cluster.logactions import (
    Append,
    Checkpoint,
    Committed,
    LogAction,
    LogSettings,
    PeerFrame,
    ReadDone,
    ReadLog,
    Reload,
    ResetLog,
    Retain,
    SaveSeen,
    Sync,
    Truncate,
)
from roost.cluster.logdisk import DiskPolicy
from roost.cluster.logreaders import CLAIMING, FOLLOWING, IDLE, LEADING, NOT_LEADER, OK, PROBED, STALE, Readers
from roost.cluster.logrecords import (
    CURSOR,
    EPOCH,
    MESSAGE,
    LogFormatError,
    LogScan,
    State,
    cursor_body,
    decode_untrusted_body,
    diverges,
    last_epoch_of,
    message_body,
    take,
)
from roost.node.segmentlog import Record

__all__ = [
    "CLAIMING", "CURSOR", "EPOCH", "FOLLOWING", "IDLE", "LEADING", "MESSAGE", "Append", "Checkpoint", "Committed",
    "LogAction", "LogFormatError", "LogScan", "LogSettings", "PeerFrame", "ReadDone", "ReadLog", "Reload", "ResetLog",
    "Retain", "SaveSeen", "State", "Sync", "Truncate", "decode_untrusted_body",
]  # fmt: skip
EPOCH_TAG_BITS = 20  # a leader epoch's low bits name the member that claimed it (``_own_epoch``)


@dataclass
class Claim:
    epoch: int
    probes: set[str]
    answers: dict[str, tuple[int, int]] = field(default_factory=dict)  # member -> (last epoch, end)
    source: str | None = None  # the owner we copy from
    asked: dict[str, float] = field(default_factory=dict)
    heard: dict[str, float] = field(default_factory=dict)  # member -> when its last answer came
    started: float = 0.0


class PartitionLog:
    def __init__(self, partition: int, me: str, settings: LogSettings) -> None:
        self.p = partition
        self.me = me
        self.s = settings
        self.disk = DiskPolicy(partition, settings)  # when to fsync, what the checkpoint says
        self.readers = Readers(self)  # the read lease, committed reads, retention
        # (a broken build for the simulator: commit what is on our own disk, not waiting for followers)
        self.early_ack = "early-ack" in settings.breaks
        self.start = self.end = self.durable = self.commit = 0
        self.epochs: list[tuple[int, int]] = []  # (leader epoch, its first offset), ascending
        self.seen = 0  # the highest leader epoch accepted for this partition
        self.saved_seen = 0  # the highest claim accepted that is on disk (``SaveSeen``)
        self.unsaved: dict[str, tuple[int, int, int]] = {}  # claimer -> (epoch, end, last epoch): answered once saved
        self.base, self.base_at = State(), 0
        self.state = State()
        self.tail: deque[tuple[Record, list[Any]]] = deque()  # records from base_at, decoded
        self.role = IDLE
        self.epoch = 0  # the epoch we lead or follow
        self.leader: str | None = None
        self.owners: list[str] = []
        self.alone = True  # we may lead with no other member to ask (a single replica, or member)
        self.probes: set[str] = set()  # whom a claim asks: the other owners and the members ``assign`` named
        self.followers: dict[str, int] = {}  # leader: follower -> the offset it last fetched from
        self.fetched_at: dict[str, float] = {}  # leader: follower -> when its last fetch came (readable)
        self.stale_until = -1e18  # fetches read before this may have waited in a socket (paused)
        self.parked: dict[str, tuple[float, int, int]] = {}  # fetcher -> (when, end, last epoch): nothing for it yet
        self.waiting: deque[tuple[int, Any]] = deque()  # (offset the commit must pass, token)
        self.claim: Claim | None = None
        self.fetch_sent = -1e18  # following / claiming: when our last FETCH left
        self.fetching = False  # a FETCH of ours is unanswered
        self.poked: dict[str, float] = {}  # leader: follower -> when we last woke it (``_wake_at``)
        self.appending = 0  # Append/Truncate/ResetLog/Reload actions not yet reported done
        self.reloading = False  # a Reload is not done: ``state`` is not known
        self.last_ms = 0  # the newest record time: an EPOCH record gets it
        self.idle_since = float("inf")  # when a higher claim or fetch last stepped us down

    # ------------------------------------------------------------ recovery

    def recovered(self, scan: LogScan) -> None:
        """The log as opened from disk (its ``keep`` at least ``cache_records`` and ``max_uncommitted``)."""
        self.start, self.end, self.durable = scan.start, scan.end, scan.end
        self.epochs, self.state, self.base, self.base_at = scan.epochs, scan.state, scan.base, scan.base_at
        self.tail, self.last_ms = scan.tail, scan.last_ms
        # (never again follow or accept a claim below what the log holds, or below a claim accepted)
        self.saved_seen = max(self.saved_seen, self.last_epoch, scan.seen)
        self.seen = max(self.seen, self.saved_seen)
        # (the checkpoint is a commit this owner knew, so never past the true one; what lies after it
        # is served once a claim and the followers' fetches commit it again)
        self.commit = max(self.start, min(scan.commit, self.end))
        self.disk.recovered(scan.commit)
        self._fold()

    def reloaded(self, scan: LogScan, now: float) -> list[LogAction]:
        """A ``Reload`` is done: the log as cut and read again from disk. Records taken since the
        cut (an EPOCH of ours: they go to disk after it) are taken again over what was read."""
        since = [rb for rb in self.tail if rb[0].offset >= scan.end]
        commit, durable = min(self.commit, scan.end), min(self.durable, scan.end)
        self.recovered(scan)
        self.commit, self.durable, self.reloading = max(self.start, commit), durable, False
        for r, b in since:
            self._take(r, b)
        return self.appended(durable, now)

    def _take(self, r: Record, b: list[Any]) -> None:
        take(self, r, b)
        # (we hold records of that epoch: a claim below it is stale. Copied from a leader, they were
        # taken with no claim; simulator seeds 79, 842: a claim below took them)
        self.seen = max(self.seen, b[0])

    @property
    def last_epoch(self) -> int:
        return last_epoch_of(self.epochs)

    def diverges(self, end: int, last_epoch: int) -> int | None:
        """Where a fetcher at ``end`` with ``last_epoch`` must cut its log to, or None (cluster/logrecords.py)."""
        return diverges(self.epochs, self.end, end, last_epoch)

    # (readers and retention: cluster/logreaders.py)

    def readable(self, now: float) -> bool:
        return self.readers.readable(now)

    def paused(self, now: float) -> None:
        self.readers.paused(now)

    def read_committed(self, start: int, limit: int, token: Any) -> tuple[list[Record] | None, list[LogAction]]:
        return self.readers.read_committed(start, limit, token)

    def retain_limit(self) -> int:
        return self.readers.retain_limit()

    def retained(self, start: int) -> None:
        self.readers.retained(start)

    def first_at(self, time_ms: int, token: Any) -> tuple[int | None, list[LogAction]]:
        return self.readers.first_at(time_ms, token)

    def _fold(self) -> None:
        """Move committed records more than ``cache_records`` behind the end into ``base``."""
        keep_from = min(self.commit, self.end - self.s.cache_records)
        while self.tail and self.tail[0][0].offset < keep_from:
            r, b = self.tail.popleft()
            self.base.apply(r.offset, b)
            self.base_at = r.offset + 1

    # ------------------------------------------------------------ roles

    def assign(self, owners: list[str], previous: list[str], map_epoch: int, now: float,
               alone: bool = True) -> list[LogAction]:  # fmt: skip
        """The map changed: ``owners`` of this partition (primary first), ``previous`` the live
        members that owned it before. ``alone``: whether we may lead with no other member to ask."""
        self.owners, self.alone = owners, alone
        self.probes = {m for m in (*owners[1:], *previous) if m != self.me}
        if owners and owners[0] == self.me:
            if self.role == LEADING:  # (a new follower may not have this log active: a FETCH wakes it)
                wake = [self._fetch_frame(m, claim=False) for m in owners[1:] if m not in self.followers]
                self.followers = {m: self.followers.get(m, -1) for m in owners[1:]}
                return [*wake, *self._advance()]
            epoch = max(map_epoch, self.last_epoch + 1, self.seen + 1)
            return self._begin_claim(epoch, set(self.probes), now)
        if self.role == FOLLOWING and owners[:1] == [self.leader]:  # (no owner live: none to follow; seed 207)
            return []
        out = self._step_down()
        if self.me in owners:
            self.role, self.leader = FOLLOWING, owners[0]
            out += self._fetch(self.leader, now)
        return out

    def _step_down(self) -> list[LogAction]:
        self.role, self.leader, self.claim = IDLE, None, None
        self.followers.clear()
        self.fetched_at.clear()
        self.parked.clear()
        self.waiting.clear()  # (never acknowledged: the publishers retry at the new leader)
        self.fetching = False
        return []

    def _own_epoch(self, at_least: int) -> int:
        """The first epoch from ``at_least`` whose low bits are a tag of our id: two members that
        claim without hearing of each other never lead one epoch on two branches (a shared one hid
        their divergence from the followers' epoch check; simulator seed 32)."""
        tag = zlib.crc32(self.me.encode()) & ((1 << EPOCH_TAG_BITS) - 1)
        e = at_least >> EPOCH_TAG_BITS << EPOCH_TAG_BITS | tag
        return e if e >= at_least else e + (1 << EPOCH_TAG_BITS)

    def _begin_claim(self, epoch: int, probes: set[str], now: float) -> list[LogAction]:
        epoch = self._own_epoch(epoch)
        self._step_down()
        self.role, self.epoch, self.seen = CLAIMING, epoch, max(self.seen, epoch)
        self.claim = Claim(epoch, probes, started=now)
        if not probes:  # (a replicated log cut off from everyone waits: its log may be stale)
            return self._lead() if self.alone else []
        out: list[LogAction] = []
        for m in sorted(probes):
            out.append(self._fetch_frame(m, claim=True))
            self.claim.asked[m] = now
        return out

    def _lead(self) -> list[LogAction]:
        """Every probed owner answered and we hold the best log: write EPOCH and lead."""
        assert self.claim is not None
        self.role, self.leader, self.claim = LEADING, self.me, None
        self.followers = {m: -1 for m in self.owners[1:]}
        body = msgpack.packb([self.epoch, EPOCH], use_bin_type=True)
        return self._append_local([body], self.last_ms)

    def _fetch_frame(self, member: str, claim: bool) -> PeerFrame:
        # (at the highest epoch we accepted: a leader below it must not count us; seed 72)
        return PeerFrame(member, ["FETCH", self.p, max(self.epoch, self.seen), self.end, self.last_epoch, claim])

    def _fetch(self, member: str, now: float) -> list[LogAction]:
        if self.fetching or self.appending:
            return []
        self.fetching, self.fetch_sent = True, now
        return [self._fetch_frame(member, claim=self.role == CLAIMING)]

    # ------------------------------------------------------------ leading: puts and cursors

    def put(self, msgs: list[list[Any]], pid: bytes, first: int, floor: int, token: Callable[[int], Any],
            now_ms: int) -> tuple[int, list[LogAction]]:  # fmt: skip
        """A durable publish of ``msgs`` (sequences from ``first``); returns (status, actions).

        Status 0: taken, maybe only its first part (as much as ``max_uncommitted`` leaves room
        for): ``token(last sequence taken)`` comes back in ``Committed`` once that is committed;
        1: not the leader; 2: too much uncommitted, retry; 3: a gap (go-back-N: resend from
        the acknowledged point)."""
        if self.role != LEADING:
            return 1, []
        if self.reloading:
            return 2, []
        last, at = self.state.producers.get(pid, (floor - 1, -1))
        # (acknowledged through floor - 1 on a branch since cut, docs/durable.md: go on from there
        # rather than refuse a gap for ever; seed 6)
        last = max(last, floor - 1)
        if first > last + 1:
            return 3, []
        new = msgs[last + 1 - first :] if last >= first else msgs
        room = self.s.max_uncommitted - (self.end - self.commit)
        if new and room <= 0:
            return 2, []
        new = new[:room]
        seq = max(first, last + 1)
        bodies = [message_body(self.epoch, m, pid, seq + i) for i, m in enumerate(new)]
        out = self._append_local(bodies, now_ms)
        taken = seq + len(new) - 1 if new else min(last, first + len(msgs) - 1)
        self.waiting.append((self.end if bodies else at + 1, token(taken)))
        out += self._advance()
        return 0, out

    def commit_cursor(self, cid: bytes, name: str, offset: int, token: Any, now_ms: int) -> tuple[int, list[LogAction]]:
        """A durable subscriber acknowledged everything before ``offset``."""
        if self.role != LEADING:
            return 1, []
        if self.reloading:
            return 2, []
        out: list[LogAction] = []
        if offset > self.state.cursors.get((cid, name), -1):
            out = self._append_local([cursor_body(self.epoch, cid, name, offset)], now_ms)
        if token is not None:
            self.waiting.append((self.end, token))
        return 0, out + self._advance()

    def _append_local(self, bodies: list[bytes], now_ms: int) -> list[LogAction]:
        if not bodies:
            return []
        recs = []
        for body in bodies:
            r = Record(self.end, now_ms, body)
            self._take(r, msgpack.unpackb(body, raw=False))
            recs.append(r)
        self.appending += 1
        out = self.disk.append(recs, self.commit)
        for m, (_, end, last_epoch) in list(self.parked.items()):  # (fetchers waiting get them now)
            out += self.readers.answer(m, end, last_epoch)
            del self.parked[m]
        return out

    def appended(self, durable: int, now: float) -> list[LogAction]:
        """An ``Append`` (or truncation) finished: everything before ``durable`` is on disk."""
        self.appending = max(0, self.appending - 1)
        self.durable = max(self.durable, min(durable, self.end))
        self.disk.written(now)
        out = self._advance()
        if self.role == FOLLOWING and self.leader is not None:
            out += self._fetch(self.leader, now)
        elif self.role == CLAIMING and self.claim is not None and self.claim.source is not None:
            out += self._fetch(self.claim.source, now)
        return out

    def _advance(self) -> list[LogAction]:
        if self.role != LEADING or not (self.followers or self.alone):
            return []  # (a replicated log's leader with no follower in its map commits nothing: it may be cut off)
        commit = self.durable if self.early_ack else min([self.durable, *self.followers.values()])
        newly: list[Record] = []
        if commit > self.commit:
            newly = [r for r, _ in self.tail if self.commit <= r.offset < commit]
            self.commit = commit
        tokens = []
        while self.waiting and self.waiting[0][0] <= commit:
            tokens.append(self.waiting.popleft()[1])
        self._fold()
        return [Committed(self.p, tokens, newly)] if tokens or newly else []

    # ------------------------------------------------------------ serving fetches

    def on_fetch(self, member: str, epoch: int, end: int, last_epoch: int, claim: bool,
                 now: float) -> list[LogAction]:  # fmt: skip
        if claim:
            # (two claims at one epoch: the greater member id wins)
            if epoch < self.seen or (epoch == self.seen and self.role in (LEADING, CLAIMING)
                                     and self.epoch == epoch and member < self.me):  # fmt: skip
                return [self.readers.data(member, STALE, end, [])]
            if epoch == self.seen and self.role in (LEADING, CLAIMING) and self.epoch == epoch:
                self._step_down()
            if epoch > self.seen:
                self.seen, self.idle_since = epoch, now
                if self.role == FOLLOWING and member == self.leader:
                    self.epoch = epoch  # (our leader claiming: follow it at that epoch)
                elif self.role != IDLE:
                    self._step_down()  # (never again follow or lead below it)
            if epoch > self.saved_seen:  # (answered once the promise is on disk: a restart forgot it; seed 4613)
                asked = any(e >= epoch for e, _, _ in self.unsaved.values())
                self.unsaved[member] = (epoch, end, last_epoch)
                return [] if asked else [SaveSeen(self.p, epoch)]
            return self.readers.answer(member, end, last_epoch, PROBED) + self._follow_primary(member, epoch, now)
        if self.role == CLAIMING and epoch <= self.epoch:
            self.parked[member] = (now, end, last_epoch)  # (answered once we lead)
            return []
        if self.role != LEADING or epoch > self.epoch:
            out: list[LogAction] = [self.readers.data(member, NOT_LEADER, end, [])]
            if self.role != CLAIMING and self.owners[:1] == [self.me] and (self.role != LEADING or epoch > self.epoch):
                # (the primary of our map, idle or below an owner's epoch: claim above it; stepping
                # down alone left no leader until the map changed again; seed 8)
                out += self._begin_claim(max(epoch, self.seen) + 1, self.probes | {member}, now)
            elif epoch > self.epoch and self.role == LEADING:
                self._step_down()
                self.idle_since = now
            return out + self._follow_primary(member, epoch, now)
        if member in self.followers and now >= self.stale_until:
            self.fetched_at[member] = now
        if member in self.followers and end <= self.end and self.diverges(end, last_epoch) is None:
            self.followers[member] = max(self.followers[member], end)
        out = self._advance()
        if end >= self.end and self.diverges(end, last_epoch) is None:
            self.parked[member] = (now, end, last_epoch)
            return out
        return out + self.readers.answer(member, end, last_epoch)

    def seen_saved(self, epoch: int, now: float) -> list[LogAction]:
        """A ``SaveSeen`` is done: the claims it covers are answered (one overtaken by a higher claim
        meanwhile is told it is stale, as ``on_fetch`` tells it)."""
        self.saved_seen = max(self.saved_seen, epoch)
        out: list[LogAction] = []
        for m, (e, end, last_epoch) in sorted(self.unsaved.items()):
            if e <= self.saved_seen:
                del self.unsaved[m]
                out += self.on_fetch(m, e, end, last_epoch, True, now)
        return out

    def _follow_primary(self, member: str, epoch: int, now: float) -> list[LogAction]:
        """Idle, an owner of our map whose primary asks at or above every epoch we accepted: follow
        it. A claim of a member our map holds down stepped us down, and the claimer died before any
        map change could set us following again: our primary led, committing nothing (review)."""
        if self.role != IDLE or self.owners[:1] != [member] or self.me not in self.owners or epoch < self.seen:
            return []
        self.role, self.leader, self.epoch = FOLLOWING, member, epoch
        return self._fetch(member, now)

    def read_done(self, token: Any, records: list[Record]) -> list[LogAction]:
        return self.readers.read_done(token, records)

    # ------------------------------------------------------------ retention

    def refresh_cursors(self, before: int, now_ms: int) -> list[LogAction]:
        """Leading: write again every cursor whose newest record lies before ``before`` (where
        retention wants to go), so that retention does not take the only record of it."""
        if self.role != LEADING or self.reloading:
            return []
        old = sorted(k for k, at in self.state.cursor_at.items() if at < before)
        bodies = [cursor_body(self.epoch, cid, name, self.state.cursors[cid, name]) for cid, name in old]
        return self._append_local(bodies, now_ms) + self._advance()

    # ------------------------------------------------------------ fetch answers

    def on_data(self, member: str, epoch: int, status: int, start: int, end: int, last_epoch: int, commit: int,
                truncate: int, reset: int, records: list[Record], asked: int,
                now: float) -> list[LogAction]:  # fmt: skip
        """An answer to our FETCH from ``asked``. One asked from another end, or while a write of
        ours is under way, answers a fetch from before that write (a fetch resent after
        ``fetch_retry`` can be answered twice): its advice to cut or reset is stale (review)."""
        if asked != self.end or self.appending:
            return []
        if epoch > self.seen and status != OK:
            self.seen = epoch
        self.fetching = False
        if self.role == CLAIMING and self.claim is not None:
            return self._claim_answer(member, epoch, status, start, end, last_epoch, truncate, reset, records, now)
        if self.role != FOLLOWING or member != self.leader or status != OK or epoch < self.seen:
            return []  # (below an epoch we accepted: an answer to a fetch from before it; seed 5136)
        if truncate < 0 and reset < 0:  # (not over a divergent tail we are told to cut: it would fold; review)
            self.commit = max(self.commit, min(commit, self.durable))
            self._fold()
        return self._copy(start, truncate, reset, records) or self._fetch(member, now)

    def _copy(self, start: int, truncate: int, reset: int, records: list[Record]) -> list[LogAction]:
        """Make our log follow the answer (the source's log begins at ``start``): cut a divergent
        tail, reset, or append its records."""
        if truncate >= self.end and self.epochs:  # (our last epoch is foreign to the leader: all of it goes)
            truncate = self.epochs[-1][1]
        gone = 0 <= truncate < self.end and truncate <= self.start  # (nothing of ours is left)
        if gone or (reset >= 0 and reset > self.end):
            reset = start if gone else reset  # (begin again where the source's log does)
            self._reset(reset)
            self.appending += 1
            return [*self.disk.cut(reset), ResetLog(self.p, reset)]
        if 0 <= truncate < self.end:
            self.appending += 1
            # (below the cache the state there is no longer in memory: the shell reads the log again,
            # and until then the producers and cursors are unknown: puts are refused as busy)
            self.reloading = truncate < self.base_at
            self._truncate(truncate)
            return [
                *self.disk.cut(truncate),
                Reload(self.p, truncate) if self.reloading else Truncate(self.p, truncate),
            ]
        recs = [r for r in records if r.offset >= self.end]
        if not recs or recs[0].offset != self.end:
            return []
        bodies = [decode_untrusted_body(r.body) for r in recs]  # (all checked before any is taken)
        for r, b in zip(recs, bodies, strict=True):
            self._take(r, b)
        self.appending += 1
        return self.disk.append(recs, self.commit)

    def _truncate(self, to: int) -> None:
        while self.tail and self.tail[-1][0].offset >= to:
            self.tail.pop()
        self.state = self.base.copy()
        for r, b in self.tail:
            self.state.apply(r.offset, b)
        self.epochs = [(e, first) for e, first in self.epochs if first < to]
        self.end = to
        self.durable = min(self.durable, to)
        self.commit = min(self.commit, to)

    def _reset(self, start: int) -> None:
        self.tail.clear()
        self.base, self.state = State(), State()
        self.epochs = []
        self.start = self.end = self.durable = self.commit = self.base_at = start

    def _claim_answer(self, member: str, epoch: int, status: int, start: int, end: int, last_epoch: int,
                      truncate: int, reset: int, records: list[Record], now: float) -> list[LogAction]:  # fmt: skip
        c = self.claim
        assert c is not None
        c.heard[member] = now
        if status == STALE or epoch > c.epoch:  # (someone claimed higher: claim above it)
            return self._begin_claim(max(epoch, self.seen) + 1, c.probes, now)
        if c.source is None:
            if member not in c.probes or status != PROBED:  # (a plain fetch's answer: the claim never got there)
                return []
            c.answers[member] = (last_epoch, end)
            if len(c.answers) < len(c.probes):
                return []
            # The longest log of the highest last epoch wins (ours on a tie): two logs with the
            # same last epoch and end hold the same records. A worse log's advice to truncate ours
            # is ignored; only the source's is taken.
            best = max(c.answers.items(), key=lambda kv: (kv[1], kv[0]))
            if best[1] <= (self.last_epoch, self.end):
                return self._lead()
            c.source = best[0]
            if member != c.source:
                return self._fetch(c.source, now)
        if member != c.source:
            return []
        if (last_epoch, end) == (self.last_epoch, self.end) and truncate < 0:
            return self._lead()
        out = self._copy(start, truncate, reset, records)
        if not out:
            out = self._fetch(c.source, now)
        return out

    # ------------------------------------------------------------ time

    def tick(self, now: float) -> list[LogAction]:
        out = self.disk.tick(now)
        for m, (since, end, _) in list(self.parked.items()):
            if now >= since + self.s.fetch_wait:
                del self.parked[m]
                out.append(self.readers.data(m, OK if self.role == LEADING else NOT_LEADER, end, []))
        if self.role == FOLLOWING and self.leader is not None and now >= self.fetch_sent + self.s.fetch_retry:
            self.fetching = False
            out += self._fetch(self.leader, now)
            self.fetch_sent = now  # (also when a write in progress holds the fetch back: no spinning)
        elif self.role == LEADING:
            # (a follower whose log is not active there does not know it follows, and one a claim
            # our map does not know of stepped down stays idle: a FETCH of ours makes it follow, or
            # the commit waited for it for ever; seed 8, a member that joined; review)
            for m in sorted(self.followers):
                if now >= self._wake_at(m):
                    self.poked[m] = now
                    out.append(self._fetch_frame(m, claim=False))
        elif self.role == IDLE and self.owners[:1] == [self.me] and now >= self.idle_since + self._silence:
            # (the primary of our map, stepped down by a claim or fetch of a member our map does not
            # name, which never led or fell silent: nothing else wakes us; fourth review)
            self.idle_since = float("inf")
            out += self._begin_claim(self.seen + 1, set(self.probes), now)
        elif self.role == CLAIMING and self.claim is not None:
            c = self.claim
            # (a member our map does not hold live, asked because it fetched from us at a higher
            # epoch, that falls silent while we wait for its answer or copy from it: its death
            # changes no map of ours, so the claim goes on without it; seed 9980)
            gone = (
                {
                    m
                    for m in c.probes - self.probes
                    if (m not in c.answers or m == c.source) and now >= c.heard.get(m, c.started) + self._silence
                }
                if not self.appending
                else ()
            )
            if gone:
                return out + self._begin_claim(max(self.seen, c.epoch) + 1, c.probes - gone, now)
            for m in sorted(c.probes):
                if m not in c.answers and now >= c.asked.get(m, -1e18) + self.s.fetch_retry:
                    c.asked[m] = now
                    out.append(self._fetch_frame(m, claim=True))
            if c.source is not None and now >= self.fetch_sent + self.s.fetch_retry:
                self.fetching = False
                out += self._fetch(c.source, now)
                self.fetch_sent = now
        return out

    def next_deadline(self) -> float:
        times = [since + self.s.fetch_wait for since, _, _ in self.parked.values()]
        if self.role == FOLLOWING or (self.claim is not None and self.claim.source is not None):
            times.append(self.fetch_sent + self.s.fetch_retry)
        if self.claim is not None:
            c = self.claim
            times += [c.asked.get(m, -1e18) + self.s.fetch_retry for m in c.probes if m not in c.answers]
        if self.role == IDLE and self.owners[:1] == [self.me]:
            times.append(self.idle_since + self._silence)
        if self.role == LEADING:
            times += [self._wake_at(m) for m in self.followers]
        times.append(self.disk.next_deadline())  # (fsync = interval: the next Sync)
        return min(times)

    @property
    def _silence(self) -> float:
        """How long a member stays silent before we act without it (re-claim, or drop it from a claim)."""
        return 3 * self.s.fetch_retry

    def _wake_at(self, follower: str) -> float:
        """When a leader wakes ``follower`` (a FETCH of ours): once it has not fetched for fetch_retry."""
        return max(self.poked.get(follower, -1e18), self.fetched_at.get(follower, -1e18)) + self.s.fetch_retry
