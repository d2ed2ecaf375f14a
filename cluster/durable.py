"""A member's durable partition logs: which it keeps, what it says to the other owners (sans-IO).

Theory of operation (docs/durable.md)
-------------------------------------
Each partition with durable messages has a log on its owners in the cluster
map; cluster/partitionlog.py is one owner's view of one log, and this component
keeps those views (``plogs``) for the member, as one of its components:

* Start-up: the runner opens every log in the data dir (torn tails cut) and
  feeds their records as ``LogsRead`` before ``Start``; only then does this
  member take durable requests or answer log fetches (before, the fetcher and
  the claimant retry).
* Who leads each partition, at which epoch and with which in-sync replicas, is
  the metadata quorum's decision (cluster/quorum.py, cluster/controller.py): this
  component holds the member's ``Quorum`` and, whenever a partition's leadership
  changes there, tells that partition's log (``lead``). It does so only while the
  member is in contact with the quorum, and takes puts, cursor commits and reads
  only then: a member cut off from the quorum's majority refuses them
  (``PUT_NO_QUORUM``) rather than act on a leadership that may be gone. A log's
  requests to the controller (``AlterIsr``, ``Reelect``) go through the quorum.
* A log is active once it has records, a put came for it, or its leader fetched
  from us (a leader wakes each follower so); an inactive partition costs nothing
  (no fetches, no files).
* The logs talk over the peer links as requests and replies: a FETCH goes on
  our dialled link to the leader, and the DATA answer comes back on that link;
  a fetch that finds the link down is retried by the log's own timer
  (``fetch_retry``).
* Disk work leaves as the log's actions (``Append``, ``Truncate``,
  ``ResetLog``, ``ReadLog``), for the runner to do in order, off the event
  loop; ``LogWritten`` and ``LogRecords`` bring the results back.
* A committed put or cursor comes back as its token: ``committed``
  collects them for whoever made the request.
* With ``cfg.trace`` (the simulator's), what the checker must know and no other
  action shows comes out as ``Trace`` actions: every record a leader commits
  (``committed``), every leader's start (``took_over``), every cursor a leader
  reads a GET from (``cursor_served``) and the records it answers with
  (``records_served``).

The member routes to :class:`DurableLogs` the runner's log events, the peers'
LOGFETCH and LOGDATA frames and the broker core's durable requests, each with
the time (``now``) and whether the member is ready, and the quorum's RAFT and
CONTROL frames and its disk's answers; the links, the map holder and the action
list are shared with the member.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any, NamedTuple

import msgpack

from roost.client.durablewire import (
    PUT_BUSY,
    PUT_NO_QUORUM,
    PUT_NOT_LEADER,
    START_EARLIEST,
    START_LATEST,
    START_OFFSET,
    encode_committed,
    encode_putack,
    encode_records,
)
from roost.cluster.config import ClusterSettings
from roost.cluster.controller import CommandError, Leadership
from roost.cluster.events import (
    LogFailed,
    LogRecords,
    LogReloaded,
    LogRetained,
    LogsRead,
    LogWritten,
    RaftPersisted,
    Send,
)
from roost.cluster.links import LinkTable
from roost.cluster.partitionlog import (
    LEADING,
    MESSAGE,
    AlterIsr,
    Committed,
    Decline,
    LogFormatError,
    LogSettings,
    PartitionLog,
    PeerFrame,
    ReadDone,
    Recovered,
    Reelect,
    Reload,
    Retain,
)
from roost.cluster.partitionmap import PartitionMap
from roost.cluster.peerwire import (
    PeerProtocolError,
    PeerType,
    check_logdata_untrusted,
    check_logfetch_untrusted,
    encode,
)
from roost.cluster.quorum import Quorum
from roost.cluster.raftactions import RaftSettings
from roost.node.actions import DurableCommit, DurableGet, DurablePut, Log, Trace
from roost.node.config import NodeConfig
from roost.node.core import BrokerCore
from roost.node.segmentlog import Record


class PutToken(NamedTuple):
    """What a client's PUT waits for: PUTACK of ``seq`` to ``addr`` once committed."""

    addr: tuple[str, int]
    pid: bytes
    partition: int
    seq: int


class CursorToken(NamedTuple):
    """What a client's COMMIT waits for: COMMITTED of ``offset`` to ``addr`` once durable."""

    addr: tuple[str, int]
    name: str
    partition: int
    offset: int


def cursor_key(name: str, topic: str) -> str:
    """A durable subscription's cursor is per (client, name) and topic: two topics of one partition
    under one name keep apart."""
    return f"{name}\0{topic}"


class DurableLogs:
    def __init__(self, member_id: str, s: ClusterSettings, cfg: NodeConfig, wall_offset: float, now: float,
                 broker: BrokerCore, links: LinkTable, maps: PartitionMap, rng: random.Random,
                 actions: list[Any]) -> None:  # fmt: skip
        self.id = member_id
        self.s = s
        self.partitioned = s.mode == "partitioned"
        self.trace = cfg.trace
        self.wall_offset = wall_offset
        self.broker = broker  # (its redirect frame: where a client goes whose partition we do not lead)
        self.links = links
        self.maps = maps
        self._out = actions
        self.now = now  # (the time of the event being handled: every entry point sets it)
        self.ready = False  # (the member is ready: every entry point that depends on it sets it)
        self.plogs: dict[int, PartitionLog] = {}
        self.log_settings = LogSettings.of(s, cfg.breaks)
        self.next_retention = now + self.log_settings.retention_check_interval
        self.logs_ready = False  # LogsRead came: durable requests are taken
        self.committed: list[Any] = []  # tokens of puts and cursor commits now durable
        self.log_requests: dict[str, int] = {}  # peer -> the link its last LOGFETCH came on
        # The earliest deadline of any log, kept between events: a log's deadline changes only through
        # its own calls, every one of which ends in ``_run_log`` (which marks it stale). Asked
        # before and after every event of the member, it cost a call per active log each time.
        self._logs_due, self._logs_due_stale = math.inf, True
        raft = RaftSettings(election_timeout=s.quorum_election_timeout,
                            heartbeat_interval=s.quorum_election_timeout / 10)  # fmt: skip
        self.quorum = Quorum(member_id, s.quorum, [], raft, s.partitions, s.durable_replicas, rng, links,
                             actions, cfg.breaks, 3 * s.fetch_retry)  # fmt: skip
        self.in_contact = False  # (the quorum's contact as of the last event: leadership is followed only with it)
        self.restarted = False  # (we held state from a former life: see ``_on_logs_read``)
        # (a broken build for the simulator, sim/breaks.py: a member out of touch with a partition's leader
        # takes it over on its own, the quorum unasked)
        self.no_quorum = "no-quorum" in cfg.breaks

    def on_log_event(
        self,
        ev: LogWritten | LogRecords | LogRetained | LogsRead | LogFailed | LogReloaded | RaftPersisted,
        now: float,
        ready: bool,
    ) -> str | None:
        """The runner's answers: a write, a read, a retention done; the logs read at start-up.

        A failed disk action stops the member (Kafka halts a broker whose only log directory
        fails): the log's records on disk are no longer those its core counts as durable, and
        serving on would acknowledge puts or answer claims from memory. Its partitions fail over
        to the other owners; restarted, it reads its logs again (a torn tail is cut) and catches up.
        Returns why the member must stop (None: it runs on)."""
        self.now, self.ready = now, ready
        if isinstance(ev, LogsRead):
            return self._on_logs_read(ev)
        if isinstance(ev, LogFailed):
            return (f"partition {ev.partition}: its durable log failed on disk ({ev.reason});"
                    " restart the member to read it again")  # fmt: skip
        if isinstance(ev, RaftPersisted):
            if ev.error:
                return f"the quorum's state failed on disk ({ev.error}); restart the member to read it again"
            self._lead(self.quorum.persisted(ev.token, now))
            return None
        log = self.plogs.get(ev.partition)
        if log is None:
            return None
        if isinstance(ev, LogWritten):
            self._run_log(log.appended(ev.durable, self.now))
        elif isinstance(ev, LogRecords):
            self._run_log(log.read_done(ev.token, ev.records))
        elif isinstance(ev, LogReloaded):
            self._run_log(log.reloaded(ev.scan, self.now))
        else:
            log.retained(ev.start)
            self._run_log(log.refresh_cursors(ev.wanted, self._wall_ms()))
        return None

    def _on_logs_read(self, ev: LogsRead) -> str | None:
        if not self.partitioned or self.logs_ready:
            return None
        if ev.error:
            return f"a durable log cannot be opened: {ev.error}"
        if ev.quorum is None:
            return "the quorum's state was not read"
        q = ev.quorum  # (a member that held any state before lived a former life: its logs may be suspect)
        self.restarted = bool(q.term or q.snapshot_index or q.entries or any(s.end for s in ev.logs.values()))
        down = self._down()
        for p, scan in ev.logs.items():
            if 0 <= p < self.s.partitions:
                self.plogs[p] = PartitionLog(p, self.id, self.log_settings, self.restarted)
                self.plogs[p].down = down
                self.plogs[p].recovered(scan)
        self.logs_ready = True
        self._logs_due_stale = True
        self._out.append(Log("info", "logs_read", {"partitions": len(ev.logs),
                             "records": sum(s.records for s in ev.logs.values())}))  # fmt: skip
        cmap = self.maps.cmap  # (the first map changes nothing: the quorum's learners are taken from it here)
        if cmap is not None:
            self.quorum.set_members(sorted(cmap.members), self.now)
        try:
            started = self.quorum.started(ev.quorum, self.now)
        except CommandError as exc:  # (a snapshot of the quorum's that passed its CRC and does not decode)
            return f"the quorum's snapshot on disk does not decode: {exc}"
        self._lead(started | set(self.plogs))
        return None

    def _log_for(self, p: int) -> PartitionLog:
        """The log of partition ``p``, made active (with an empty log) if it was not."""
        log = self.plogs.get(p)
        if log is None:
            log = self.plogs[p] = PartitionLog(p, self.id, self.log_settings, self.restarted)
            log.down = self._down()
            self._logs_due_stale = True
            if self.in_contact:
                self._run_log(log.lead(self.quorum.leadership(p), self.now))
        return log

    def _down(self) -> frozenset[str]:
        """The members our map holds down (a leader drops them from its ISR: ``peers_down``)."""
        cmap = self.maps.cmap
        return frozenset(cmap.members) - cmap.live if cmap is not None else frozenset()

    def _lead(self, changed: set[int]) -> None:
        """Partitions whose leadership changed in the quorum: their logs follow it (in contact)."""
        if not self.logs_ready or not self.in_contact:
            return
        for p in sorted(changed):  # (an inactive log stays so: a put or its leader's FETCH wakes it)
            log = self.plogs.get(p)
            if log is not None:
                self._run_log(log.lead(self.quorum.leadership(p), self.now))

    def _contact(self) -> bool:
        """Whether we are in contact with the quorum now; when it comes back, every log follows the
        leadership as it is now (what changed meanwhile was not followed)."""
        if self.no_quorum:
            self._take_over()
            return True
        contact = self.quorum.contact(self.now)
        if contact and not self.in_contact:
            self.in_contact = True
            self._lead({*self.plogs, *self.quorum.meta.partitions})
        self.in_contact = contact
        return contact

    def _take_over(self) -> None:
        """The no-quorum broken build: the first live replica of a partition whose leader our map
        holds down leads it, at the next epoch, with every live replica in sync."""
        cmap = self.maps.cmap
        if cmap is None or not self.logs_ready:
            return
        self.in_contact = True
        for p, log in self.plogs.items():
            lead = log.leadership or self.quorum.leadership(p)
            if lead is None or lead.leader in cmap.live:
                continue
            live = [m for m in lead.replicas if m in cmap.live]
            if live[:1] == [self.id]:
                mine = Leadership(lead.replicas, self.id, max(lead.epoch, log.epoch) + 1, tuple(live), lead.version)
                self._run_log(log.lead(mine, self.now))

    def map_changed(self, old: Any, now: float, ready: bool) -> None:
        """The map changed: the quorum's learners are every placed member, and the controller (if
        we are it) decides again with the members it now sees live."""
        self.now, self.ready = now, ready
        cmap = self.maps.cmap
        if cmap is None:
            return
        if sorted(cmap.members) != self.quorum.members:
            self._lead(self.quorum.set_members(sorted(cmap.members), now))
        if self.logs_ready:
            self._contact()
            self._lead(self.quorum.tick(now, sorted(cmap.members), cmap.live))
            down = self._down()
            for log in self.plogs.values():  # (a leader drops a follower held down from its ISR)
                if log.down != down:
                    self._run_log(log.peers_down(down, now))

    def on_raft(self, peer: str, f: list[Any], now: float) -> None:
        self.now = now
        self._contact()
        self._lead(self.quorum.on_raft(peer, f, now))
        self._contact()

    def on_control(self, peer: str, f: list[Any], now: float) -> None:
        self.now = now
        self._lead(self.quorum.on_control(peer, f, now))

    def _run_log(self, actions: list[Any]) -> None:
        self._logs_due_stale = True
        if self.trace:
            self._trace_log(actions)
        for a in actions:
            cls = a.__class__
            if cls is PeerFrame:
                self._log_frame(a)
            elif cls is Committed:
                for t in a.tokens:
                    if t.__class__ is PutToken:
                        self._out.append(Send(t.addr, encode_putack(t.pid, t.partition, t.seq, 0)))
                    elif t.__class__ is CursorToken:
                        self._out.append(Send(t.addr, encode_committed(t.name, t.partition, t.offset, 0)))
                    else:
                        self.committed.append(t)
            elif cls is ReadDone:
                if a.token[0] == "seek":  # (the offset of a time older than the cache: now the GET)
                    get, log = a.token[1], self.plogs[a.token[1].partition]
                    at = a.records[0].offset if a.records else log.commit
                    self._on_get(get._replace(start=START_OFFSET, start_at=at))
                else:
                    self._answer_get(a.token, a.records)
            elif cls is AlterIsr or cls is Reelect or cls is Decline or cls is Recovered:
                self._lead(self.quorum.ask(a, self.now))
            elif cls is Reload:  # (a cut below the cache: rare, and worth a line; the runner does it)
                self._out.append(Log("warning", "log_reload", {"partition": a.partition, "to": a.to}))
                self._out.append(a)
            else:  # (Append, Truncate, ResetLog, ReadLog: the runner's)
                self._out.append(a)

    def _trace_log(self, actions: list[Any]) -> None:
        """The simulator's checker (sim/durablecheck.py) hears every record a leader commits, with the
        members holding it on disk then (the leader and the followers whose fetches passed it)."""
        for a in actions:
            if a.__class__ is Committed and a.records:
                holders = {self.id, *(m for m, end in self.plogs[a.partition].followers.items()
                                      if end > a.records[-1].offset)}  # fmt: skip
                self._out.append(Trace("committed", {"partition": a.partition, "records": a.records,
                                                     "holders": holders}))  # fmt: skip

    def _log_frame(self, a: PeerFrame) -> None:
        f = a.frame
        if f[0] == "FETCH":
            lid = self.links.up(a.member)
            if lid is not None:
                self.links.frame(lid, encode([PeerType.LOGFETCH, *f[1:]]))
        else:
            lid = self.log_requests.get(a.member)
            link = self.links.links.get(lid) if lid is not None else None
            if link is not None and link.up and not link.outbound:
                self.links.frame(link.id, encode([PeerType.LOGDATA, *f[1:]]))

    # ------------------------------------------------------------ peer frames

    def on_logfetch(self, peer: str, lid: int, f: list[Any], now: float, ready: bool) -> None:
        """A peer's LOGFETCH on the link ``lid`` it dialled (the answer goes back there)."""
        self.now, self.ready = now, ready
        p, epoch, end, last_epoch = check_logfetch_untrusted(f, self.s.partitions)
        self.log_requests[peer] = lid
        if not self.logs_ready or not ready:
            return  # (it asks again)
        self._run_log(self._log_for(p).on_fetch(peer, epoch, end, last_epoch, self.now))

    def on_logdata(self, peer: str, f: list[Any], now: float, ready: bool) -> None:
        """A peer's LOGDATA: the answer to our LOGFETCH."""
        self.now, self.ready = now, ready
        p, epoch, status, start, end, last_epoch, commit, truncate, reset, recs, asked = check_logdata_untrusted(
            f, self.s.partitions
        )
        log = self.plogs.get(p)
        if log is None:
            return
        records = [Record(o, t, b) for o, t, b in recs]
        self._logs_due_stale = True  # (also when the answer is refused half-way)
        try:
            actions = log.on_data(peer, epoch, status, start, end, last_epoch, commit, truncate, reset, records,
                                  asked, self.now)  # fmt: skip
        except LogFormatError as exc:
            raise PeerProtocolError(f"LOGDATA: {exc}") from None
        self._run_log(actions)

    # ------------------------------------------------------------ requests and time

    def put(self, p: int, msgs: list[list[Any]], pid: bytes, first: int, floor: int,
            token: Callable[[int], Any], wall_ms: int, now: float, ready: bool) -> int:  # fmt: skip
        """A durable publish to partition ``p``; its status (cluster/partitionlog.py ``put``).
        ``token(last sequence taken)`` is in ``committed`` once that much is committed."""
        self.now, self.ready = now, ready
        if not self.logs_ready or not ready:
            return 1
        if not self._contact():
            return PUT_NO_QUORUM
        status, actions = self._log_for(p).put(msgs, pid, first, floor, token, wall_ms)
        self._run_log(actions)
        return status

    def on_put(self, a: DurablePut, now: float, ready: bool) -> None:
        """A client's PUT: acknowledged (PUTACK) once committed, or at once with why not."""
        self.now = now
        status = self.put(a.partition, a.msgs, a.pid, a.first, a.floor, lambda last: PutToken(a.addr, a.pid,
                          a.partition, last), self._wall_ms(), now, ready)  # fmt: skip
        if status:
            self._out.append(Send(a.addr, encode_putack(a.pid, a.partition, 0, status)))
            redirect = self.broker.redirect_frame
            # (our map, where it leads; not without contact: a minority's map names its own side, and
            # a client that took it, its epoch higher, would come back here for ever)
            if status == PUT_NOT_LEADER and redirect is not None:
                self._out.append(Send(a.addr, redirect))

    def _leading(self, p: int, addr: tuple[str, int]) -> PartitionLog | None:
        """The log of ``p`` if we lead it (in contact with the quorum); else None, and the client
        hears where to go."""
        contact = self._contact()
        log = self._log_for(p) if self.logs_ready and self.ready and contact else None
        if log is not None and log.role == LEADING:
            return log
        redirect = self.broker.redirect_frame
        if redirect is not None and contact:  # (not without contact: see ``on_put``)
            self._out.append(Send(addr, redirect))
        return None

    def on_get(self, a: DurableGet, now: float, ready: bool) -> None:
        """A client's GET (see ``_serve_get``)."""
        self.now, self.ready = now, ready
        self._on_get(a)

    def _on_get(self, a: DurableGet) -> None:
        self._serve_get(a)
        if self.trace:  # (the cursor a leader read it from, for the simulator's checker)
            log = self.plogs.get(a.partition)
            # (a leader whose read lease ran out refuses the GET: it served no cursor; seed 20)
            if log is not None and log.role == LEADING and log.readable(self.now):
                key = cursor_key(a.name, a.topic)
                v = log.state.cursors.get((a.did, key))
                if v is not None:
                    self._out.append(Trace("cursor_served", {"partition": a.partition, "did": a.did, "key": key,
                                                             "cursor": v, "member": self.id}))  # fmt: skip

    def _serve_get(self, a: DurableGet) -> None:
        """A GET: committed records of the topic from the subscription's cursor (made at ``start``
        if it does not exist yet). Records of the partition's other topics are skipped."""
        log = self._leading(a.partition, a.addr)
        if log is None:
            why = PUT_NOT_LEADER if self.in_contact else PUT_NO_QUORUM
            self._out.append(Send(a.addr, encode_records(a.name, a.partition, 0, 0, why, [])))
            return
        if not log.readable(self.now):  # (no follower fetched from us lately: we may be a stale leader)
            self._out.append(Send(a.addr, encode_records(a.name, a.partition, 0, 0, PUT_BUSY, [])))
            return
        if not a.name:  # (a plain read: the reader keeps its own offsets)
            self._read_from(log, a, min(max(a.read_from, log.start), log.commit))
            return
        key = (a.did, cursor_key(a.name, a.topic))
        cursor = log.state.cursors.get(key)
        if cursor is None:  # (a new durable subscription: its cursor is written first, then read from)
            cursor = {START_EARLIEST: log.start, START_LATEST: log.commit,
                      START_OFFSET: min(max(a.start_at, log.start), log.commit)}.get(a.start)  # fmt: skip
            if cursor is None:  # (START_TIME: on disk, this GET goes on once the offset is found)
                cursor, actions = log.first_at(a.start_at, ("seek", a))
                self._run_log(actions)
                if cursor is None:
                    return
            status, actions = log.commit_cursor(key[0], key[1], cursor, None, self._wall_ms())
            self._run_log(actions)
            if status:
                self._out.append(Send(a.addr, encode_records(a.name, a.partition, 0, 0, PUT_BUSY, [])))
                return
        self._read_from(log, a, max(cursor, min(a.read_from, log.commit)))  # (what this reader holds: not again)

    def _read_from(self, log: PartitionLog, a: DurableGet, cursor: int) -> None:
        token = ("get", a.addr, a.name, a.topic, a.partition, cursor, a.most)
        records, actions = log.read_committed(cursor, self.log_settings.fetch_records, token)
        self._run_log(actions)
        if records is not None:
            self._answer_get(token, records)

    def _answer_get(self, token: Any, records: list[Record]) -> None:
        _, addr, name, topic, p, cursor, most = token
        log = self.plogs[p]
        out: list[list[Any]] = []
        scanned = cursor
        for r in records:
            b = msgpack.unpackb(r.body, raw=False)
            if len(out) >= most:
                break
            scanned = r.offset + 1
            if b[1] == MESSAGE and b[2] == topic:
                out.append([r.offset, r.time_ms, b[2], b[3], b[4], b[5]])
        self._out.append(Send(addr, encode_records(name, p, cursor, scanned, 0, out, log.start, log.commit)))
        if self.trace:  # (the records it answered with: those it scanned)
            served = [r for r in records if r.offset < scanned]
            self._out.append(Trace("records_served", {"name": name, "partition": p, "records": served}))

    def on_commit(self, a: DurableCommit, now: float, ready: bool) -> None:
        """A COMMIT: the cursor moves (never back); COMMITTED once that is durable."""
        self.now, self.ready = now, ready
        log = self._leading(a.partition, a.addr)
        if log is None:
            why = PUT_NOT_LEADER if self.in_contact else PUT_NO_QUORUM
            self._out.append(Send(a.addr, encode_committed(a.name, a.partition, a.offset, why)))
            return
        offset = min(a.offset, log.commit)  # (nothing past what a reader can have been given)
        token = CursorToken(a.addr, a.name, a.partition, offset)
        status, actions = log.commit_cursor(a.did, cursor_key(a.name, a.topic), offset, token, self._wall_ms())
        self._run_log(actions)
        if status:
            self._out.append(Send(a.addr, encode_committed(a.name, a.partition, offset, PUT_BUSY)))

    def _wall_ms(self) -> int:
        return int((self.now + self.wall_offset) * 1000)

    def paused(self, now: float) -> None:
        """We stood still (cluster/liveness.py): no log takes a read lease from what waited meanwhile."""
        self.now = now
        for log in self.plogs.values():
            log.paused(self.now)
        self._logs_due_stale = True

    def due(self, now: float, ready: bool) -> None:
        """The logs' timers (fetches, claims, leases) and the retention check."""
        self.now, self.ready = now, ready
        if self.deadline() > now:
            return
        if self.logs_ready and self.quorum.deadline() <= now:
            cmap = self.maps.cmap
            placed, live = (sorted(cmap.members), cmap.live) if cmap is not None else ([], frozenset[str]())
            self._contact()
            self._lead(self.quorum.tick(now, placed, live))
            self._contact()
        for log in self.plogs.values():
            if log.next_deadline() <= self.now:
                self._run_log(log.tick(self.now))
        if self.now >= self.next_retention:
            self.next_retention = self.now + self.log_settings.retention_check_interval
            s = self.log_settings
            max_bytes = s.retention_bytes or 1 << 62
            if self.logs_ready:
                for p, log in self.plogs.items():
                    self._out.append(Retain(p, log.retain_limit(), self._wall_ms(), max_bytes,
                                            int(s.retention_age * 1000)))  # fmt: skip

    def deadline(self) -> float:
        if self._logs_due_stale:
            self._logs_due = min((log.next_deadline() for log in self.plogs.values()), default=math.inf)
            self._logs_due_stale = False
        return min(self._logs_due, self.next_retention, self.quorum.deadline())
