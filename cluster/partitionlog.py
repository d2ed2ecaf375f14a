"""A durable partition's log as one of its owners runs it: offsets, commit, leader epochs (sans-IO).

Theory of operation (docs/durable.md)
-------------------------------------
Durable messages of a topic go to the log of the topic's partition, kept by the
partition's replicas, one of which the metadata quorum names leader (below).
This object is one replica's view of one partition. It does no I/O: it asks for
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
what the leader and every follower it counts in sync have on disk; a follower
fetches from offset X only once everything before X is durable with it, so the
leader's commit is the least of its own ``durable`` and those followers' fetch
offsets at its epoch. A put is acknowledged (``Committed``) once the commit
passes it, and readers are served only what lies below the commit: a leader
that dies cannot take an acknowledged record with it, its ISR has it on disk.

Following is pulled (Kafka's design): the follower sends ``FETCH [p, epoch,
end, last epoch of its log]`` and the leader answers ``DATA`` with the
records from ``end``, holding a fetch with nothing to give for ``fetch_wait``.
A follower whose log diverges (it has records of an epoch that ended earlier
on the leader) is told to truncate to where that epoch ended on the leader
(``end_for_epoch``, Kafka's OffsetsForLeaderEpoch); one whose end is before the
leader's start (retention) resets to it.

Leading. Who leads, at which epoch, and with which in-sync replicas (ISR) is
decided by the metadata quorum (cluster/controller.py), and told to the log by
``lead`` (versions only rise: an older one is ignored). A member leads only an
epoch it begins: one its log holds records of, or the one of the first leadership
it is told in a life (it may have begun that one before a restart: a leader serves
followers from memory, so they may hold records of it its disk lost), it asks the
quorum to replace (``Reelect``). Under an fsync policy that can lose written
records (``interval``, ``never``) a restarted log is *suspect*: a power loss may
have taken records it acknowledged. Until its fetches from a leader reach that
leader's end it does not lead: named the leader, it declines (``Decline``, with
its log's end) and the controller names another or, when all in the ISR have
declined, the longest log, alone in the ISR (which it then leads). A leader writes an ``EPOCH`` record and serves
fetches of its epoch only (``NOT_LEADER`` to a newer one, ``STALE`` to an older);
a follower fetches at the epoch it was told and takes answers of that epoch only.
A put is committed once the leader and every ISR member have it on disk, and only
while the ISR has ``min_insync`` members (or every replica, if fewer: one replica
commits alone); puts are refused as busy below that. The controller makes leaders
from the ISR only, so a new leader holds every committed record and the others cut
what it lacks. The leader asks the controller (``AlterIsr``, one request at a
time, sent again until a newer version decides it) to drop a follower that has not
caught up for ``isr_lag_time`` (never below ``min_insync``) and to add one whose
fetch reached the commit, which it counts from that moment until a newer version
(Kafka's maximal ISR): the quorum's ISR is never larger than the one it counts.

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

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import msgpack

from roost.cluster.controller import Leadership
from roost.cluster.logactions import (
    AlterIsr,
    Append,
    Checkpoint,
    Committed,
    Decline,
    LogAction,
    LogSettings,
    PeerFrame,
    ReadDone,
    ReadLog,
    Recovered,
    Reelect,
    Reload,
    ResetLog,
    Retain,
    Sync,
    Truncate,
)
from roost.cluster.logdisk import DiskPolicy
from roost.cluster.logreaders import FOLLOWING, IDLE, LEADING, NOT_LEADER, OK, STALE, Readers
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
    "CURSOR", "EPOCH", "FOLLOWING", "IDLE", "LEADING", "MESSAGE", "AlterIsr", "Append", "Checkpoint",
    "Committed", "Decline", "LogAction", "LogFormatError", "LogScan", "LogSettings", "PeerFrame", "ReadDone",
    "ReadLog", "Recovered", "Reelect", "Reload", "ResetLog", "Retain", "State", "Sync", "Truncate",
    "decode_untrusted_body",
]  # fmt: skip


class PartitionLog:
    def __init__(self, partition: int, me: str, settings: LogSettings, restarted: bool = False) -> None:
        self.p = partition
        self.me = me
        self.s = settings
        self.disk = DiskPolicy(partition, settings)  # when to fsync, what the checkpoint says
        self.readers = Readers(self)  # the read lease, committed reads, retention
        # (a broken build for the simulator: commit what is on our own disk, not waiting for followers)
        self.early_ack = "early-ack" in settings.breaks
        self.start = self.end = self.durable = self.commit = 0
        self.epochs: list[tuple[int, int]] = []  # (leader epoch, its first offset), ascending
        self.seen = 0  # the highest leader epoch we were told of (or hold records of)
        self.base, self.base_at = State(), 0
        self.state = State()
        self.tail: deque[tuple[Record, list[Any]]] = deque()  # records from base_at, decoded
        self.role = IDLE
        self.epoch = 0  # the epoch we lead or follow
        self.leader: str | None = None
        self.leadership: Leadership | None = None  # as the quorum last told us
        self.isr: set[str] = set()  # leading: the followers in sync, as the quorum holds them
        self.adding: set[str] = set()  # leading: followers we asked to add (counted already)
        self.asked: tuple[int, tuple[str, ...], float] | None = None  # leading: our last AlterIsr (version, isr, when)
        self.caught_up: dict[str, float] = {}  # leading: follower -> when it last reached our end
        self.answered_end: dict[str, int] = {}  # leading: follower -> our end when we last answered it
        self.followers: dict[str, int] = {}  # leader: follower -> the offset it last fetched from
        self.fetched_at: dict[str, float] = {}  # leader: follower -> when its last fetch came (readable)
        self.stale_until = -1e18  # fetches read before this may have waited in a socket (paused)
        self.parked: dict[str, tuple[float, int, int]] = {}  # fetcher -> (when, end, last epoch): nothing for it yet
        self.waiting: deque[tuple[int, Any]] = deque()  # (offset the commit must pass, token)
        self.fetch_sent = -1e18  # following: when our last FETCH left
        self.fetching = False  # a FETCH of ours is unanswered
        self.poked: dict[str, float] = {}  # leader: follower -> when we last woke it (``_wake_at``)
        self.appending = 0  # Append/Truncate/ResetLog/Reload actions not yet reported done
        self.reloading = False  # a Reload is not done: ``state`` is not known
        self.last_ms = 0  # the newest record time: an EPOCH record gets it
        self.reelect_asked = -1e18  # when we last asked the quorum for a new epoch of ours (``Reelect``)
        self.told = False  # a leadership was told to us in this life (``lead``)
        # (our log may lack records we wrote and acknowledged before a restart: the fsync policy lets a
        # power loss take them; until we caught up from a leader we lead only if the controller names us
        # alone in the ISR after we declined: ``_reelect``)
        self.suspect = restarted and settings.fsync != "always"
        self.declined = False  # (we declined to lead since another was last named: ``lead``)
        self.reported = -1e18  # suspect, in the ISR, not named: when we last told the controller (``Decline``)
        self.down: frozenset[str] = frozenset()  # the members our map holds down (``peers_down``)
        self.need = settings.min_insync  # leading: members (us too) that must hold a record to commit it

    # ------------------------------------------------------------ recovery

    def recovered(self, scan: LogScan) -> None:
        """The log as opened from disk (its ``keep`` at least ``cache_records`` and ``max_uncommitted``)."""
        self.start, self.end, self.durable = scan.start, scan.end, scan.end
        self.epochs, self.state, self.base, self.base_at = scan.epochs, scan.state, scan.base, scan.base_at
        self.tail, self.last_ms = scan.tail, scan.last_ms
        self.seen = max(self.seen, self.last_epoch)
        # (the checkpoint is a commit this owner knew, so never past the true one; what lies after it
        # is served once a leader and its followers' fetches commit it again)
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
        self.seen = max(self.seen, b[0])  # (we hold records of that epoch: we never lead it again)

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

    def lead(self, lead: Leadership | None, now: float) -> list[LogAction]:
        """The quorum's leadership of this partition (None: it has none), as applied here. A suspect
        log in the ISR tells the controller so at once (``_report``), named or not: it must not be
        made leader, nor another ISR member dropped as if it could lead."""
        if lead is not None and lead.leader != self.me:
            self.declined = False  # (another was named: being named alone later is no answer to us)
        out = self._lead(lead, now)
        if self.suspect and lead is not None and lead.leader != self.me and self.me in lead.isr:
            out = [*out, *self._report(now)]
        return out

    def _report(self, now: float) -> list[LogAction]:
        if now < self.reported + self.s.fetch_retry:
            return []
        self.reported = now
        return [Decline(self.p, self.end, self.last_epoch)]

    def _lead(self, lead: Leadership | None, now: float) -> list[LogAction]:
        old = self.leadership
        if lead is not None and old is not None and lead.version < old.version:
            return []  # (an older decision told late: the quorum's versions only rise)
        self.leadership = lead
        if lead is not None and not self.told:
            # (the first decision of this life may be one we began before a restart, with records of
            # it on followers that our disk lost: we never begin it, but ask for a new epoch)
            self.told = True
            self.seen = max(self.seen, lead.epoch)
        if lead is None or lead.epoch < self.epoch or (lead.leader != self.me and self.me not in lead.replicas):
            return self._step_down() if lead is None or lead.epoch >= self.epoch else []
        if lead.leader == self.me:
            if self.role == LEADING and self.epoch == lead.epoch:
                return self._in_sync(lead, now)
            self._step_down()
            if self.suspect and self.declined and lead.isr == (self.me,):
                self.suspect = False  # (named alone after we declined: the controller found no better log)
            if self.suspect or lead.epoch <= self.seen:  # (we led it before a restart, or hold its records)
                self.epoch = lead.epoch
                return self._reelect(now)
            return self._begin(lead, now)
        self.seen = max(self.seen, lead.epoch)
        if lead.leader is None:
            self._step_down()
            self.epoch = lead.epoch
            return []
        if self.role == FOLLOWING and self.leader == lead.leader and self.epoch == lead.epoch:
            return []
        self._step_down()
        self.role, self.leader, self.epoch = FOLLOWING, lead.leader, lead.epoch
        return self._fetch(lead.leader, now)

    def _step_down(self) -> list[LogAction]:
        self.role, self.leader = IDLE, None
        self.followers.clear()
        self.fetched_at.clear()
        self.parked.clear()
        self.waiting.clear()  # (never acknowledged: the publishers retry at the new leader)
        self.isr.clear()
        self.adding.clear()
        self.caught_up.clear()
        self.answered_end.clear()
        self.asked = None
        self.fetching = False
        return []

    def _reelect(self, now: float) -> list[LogAction]:
        """Ask the quorum for a new epoch of ours: we must not go on with one begun in a former life
        (a follower may hold records of it that our disk lost) or one whose records we hold. A suspect
        log declines instead: another ISR member may hold records it lost."""
        if now < self.reelect_asked + self.s.fetch_retry:
            return []
        self.reelect_asked = now
        if self.suspect:
            self.declined = True
            return [Decline(self.p, self.end, self.last_epoch)]
        return [Reelect(self.p, self.epoch, self.seen + 1)]  # (above every epoch our log holds)

    def _begin(self, lead: Leadership, now: float) -> list[LogAction]:
        """Lead at ``lead.epoch``: write EPOCH; every other replica follows, the ISR counts."""
        self.role, self.leader, self.epoch, self.seen = LEADING, self.me, lead.epoch, lead.epoch
        self.followers = {m: -1 for m in lead.replicas if m != self.me}
        self.isr = {m for m in lead.isr if m != self.me}
        self.need = min(self.s.min_insync, len(lead.replicas))  # (one replica: it commits alone)
        self.caught_up = dict.fromkeys(self.isr, now)  # (each gets isr_lag_time from our start)
        body = msgpack.packb([self.epoch, EPOCH], use_bin_type=True)
        out = self._append_local([body], self.last_ms) + [self._fetch_frame(m) for m in sorted(self.followers)]
        return out + self._alter_isr(now)  # (a follower held down, such as the leader before us, goes)

    def _in_sync(self, lead: Leadership, now: float) -> list[LogAction]:
        """A new version of the leadership we hold: its replicas and ISR. What we asked to add is
        counted until the quorum decided (a version past the one we asked against)."""
        if self.asked is not None and lead.version > self.asked[0]:
            self.asked = None
            self.adding.clear()
        self.isr = {m for m in lead.isr if m != self.me}
        self.need = min(self.s.min_insync, len(lead.replicas))
        wake = [self._fetch_frame(m) for m in lead.replicas if m != self.me and m not in self.followers]
        self.followers = {m: self.followers.get(m, -1) for m in lead.replicas if m != self.me}
        for m in self.isr:
            self.caught_up.setdefault(m, now)
        return [*wake, *self._advance()]

    def _counted(self) -> set[str]:
        return self.isr | self.adding

    def peers_down(self, down: frozenset[str], now: float) -> list[LogAction]:
        """The members our map holds down now: a leader asks to drop such followers from the ISR at
        once (never below ``min_insync``), not after ``isr_lag_time``. Only a leader that began its
        epoch does: it holds every committed record, so the ISR it leaves holds them all too (the
        controller drops nobody itself: a suspect it named may lack them)."""
        self.down = down
        return self._alter_isr(now) if self.role == LEADING else []

    def _alter_isr(self, now: float, fetcher: str | None = None, at: int = -1) -> list[LogAction]:
        """Leading: ask to drop a follower that has not caught up for ``isr_lag_time`` or that our
        map holds down (never below ``min_insync``), or to add ``fetcher``, whose fetch from ``at``
        (its log matching ours there) now reached the commit: counted from now on (what it fetched from is on its disk;
        an offset it fetched from long ago is no reason to add it, its disk may have lost it)."""
        lead = self.leadership
        if lead is None or self.role != LEADING or lead.epoch != self.epoch:
            return []
        if self.asked is not None and now < self.asked[2] + self.s.fetch_retry:
            return []
        if self.asked is not None and self.asked[0] == lead.version:  # (not decided yet: asked again)
            self.asked = (lead.version, self.asked[1], now)
            return [AlterIsr(self.p, self.epoch, lead.version, self.asked[1])]
        counted = self._counted()
        lagging = sorted(
            m for m in self.isr if m in self.down or now >= self.caught_up.get(m, now) + self.s.isr_lag_time
        )
        joins = fetcher is not None and fetcher not in counted and at >= self.commit and at > self.epochs[-1][1]
        isr = set(counted)
        if joins and fetcher is not None:
            self.adding.add(fetcher)
            isr.add(fetcher)
        elif lagging and len(counted) + 1 > self.need:
            isr.discard(lagging[0])
        else:
            return []
        new = tuple(m for m in lead.replicas if m == self.me or m in isr)
        self.asked = (lead.version, new, now)
        return [AlterIsr(self.p, self.epoch, lead.version, new)]

    def _fetch_frame(self, member: str) -> PeerFrame:
        return PeerFrame(member, ["FETCH", self.p, self.epoch, self.end, self.last_epoch])

    def _fetch(self, member: str, now: float) -> list[LogAction]:
        if self.fetching or self.appending:
            return []
        self.fetching, self.fetch_sent = True, now
        return [self._fetch_frame(member)]

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
        if self.reloading or len(self._counted()) + 1 < self.need:
            return 2, []  # (too few in sync: taken, it could not commit; the client retries)
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
            self.answered_end[m] = self.end  # (caught up, at its next fetch, only if it reaches this)
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
        return out

    def _advance(self) -> list[LogAction]:
        if self.role != LEADING or len(self._counted()) + 1 < self.need:
            return []  # (too few in sync: nothing commits, so nothing is acknowledged on fewer disks)
        counted = self._counted()
        commit = self.durable if self.early_ack else min([self.durable, *(self.followers.get(m, -1) for m in counted)])
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

    def on_fetch(self, member: str, epoch: int, end: int, last_epoch: int, now: float) -> list[LogAction]:
        """A follower's FETCH at ``epoch`` from ``end``: answered only by the leader of that epoch
        (a follower that knows a newer one is told we are not; one behind is told it is stale)."""
        if self.role != LEADING or epoch != self.epoch or member not in self.followers:
            return [self.readers.data(member, NOT_LEADER if epoch >= self.epoch else STALE, end, [])]
        if now >= self.stale_until:
            self.fetched_at[member] = now
        matched = end <= self.end and self.diverges(end, last_epoch) is None
        if matched:
            self.followers[member] = max(self.followers[member], end)
            if end >= self.answered_end.get(member, self.end):
                self.caught_up[member] = now  # (it has all we had when we last answered it)
        out = self._advance() + self._alter_isr(now, member, end if matched else -1)  # (it may join now)
        if end >= self.end and self.diverges(end, last_epoch) is None:
            self.parked[member] = (now, end, last_epoch)
            return out
        self.answered_end[member] = self.end
        return out + self.readers.answer(member, end, last_epoch)

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
        ``fetch_retry`` can be answered twice): its advice to cut or reset is stale (review).
        Only our leader's answers at the epoch we follow count."""
        if asked != self.end or self.appending:
            return []
        self.fetching = False
        if self.role != FOLLOWING or member != self.leader or status != OK or epoch != self.epoch:
            return []  # (tick asks again after fetch_retry)
        if truncate < 0 and reset < 0:  # (not over a divergent tail we are told to cut: it would fold; review)
            self.commit = max(self.commit, min(commit, self.durable))
            self._fold()
        out = self._copy(start, truncate, reset, records) or self._fetch(member, now)
        if self.suspect and truncate < 0 and reset < 0 and self.end >= end:
            # (we hold all the leader held: as good as any ISR member; its commit is not enough, a new
            # leader's can lag what was committed before it)
            self.suspect = False
            out.append(Recovered(self.p))
        return out

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
            # (a follower whose log is not active there does not know it follows: a FETCH of ours
            # wakes it, or the commit waited for it for ever; seed 8, a member that joined; review)
            for m in sorted(self.followers):
                if now >= self._wake_at(m):
                    self.poked[m] = now
                    out.append(self._fetch_frame(m))
            out += self._alter_isr(now)
        elif (self.role == IDLE and self.leadership is not None and self.leadership.leader == self.me
              and self.leadership.epoch == self.epoch):  # fmt: skip
            out += self._reelect(now)  # (asked again until the quorum gives us a new epoch)
        lead = self.leadership
        if self.suspect and lead is not None and lead.leader != self.me and self.me in lead.isr:
            out += self._report(now)  # (again each fetch_retry: a new controller does not know it)
        return out

    def next_deadline(self) -> float:
        times = [since + self.s.fetch_wait for since, _, _ in self.parked.values()]
        if self.role == FOLLOWING:
            times.append(self.fetch_sent + self.s.fetch_retry)
        if self.role == LEADING:
            times += [self._wake_at(m) for m in self.followers]
            if self.asked is not None:  # (asked again until decided)
                times.append(self.asked[2] + self.s.fetch_retry)
            elif len(self._counted()) + 1 > self.need:  # (a lagging follower may be dropped: when)
                times += [self.caught_up.get(m, math.inf) + self.s.isr_lag_time for m in self.isr]
        elif self.leadership is not None and self.leadership.leader == self.me and self.leadership.epoch == self.epoch:
            times.append(self.reelect_asked + self.s.fetch_retry)
        lead = self.leadership
        if self.suspect and lead is not None and lead.leader != self.me and self.me in lead.isr:
            times.append(self.reported + self.s.fetch_retry)
        times.append(self.disk.next_deadline())  # (fsync = interval: the next Sync)
        return min(times)

    def _wake_at(self, follower: str) -> float:
        """When a leader wakes ``follower`` (a FETCH of ours): once it has not fetched for fetch_retry."""
        return max(self.poked.get(follower, -1e18), self.fetched_at.get(follower, -1e18)) + self.s.fetch_retry
