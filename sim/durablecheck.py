"""What the simulator checks of durable mode (docs/durable.md): acknowledged puts, owners' logs,
consumers, cursors.

Theory of operation
-------------------
The durable workload (sim/durable.py) reports to a :class:`DurableCheck` as things
happen: a put acknowledged to a producer, a record delivered to a consumer's application, and,
from hooks on the member cores, every record a leader commits (with the members that hold it on
disk at that moment: the leader and the followers whose fetches passed it) and every cursor a
leader serves a GET from. At the end,
after the heal, the quiet period and the settle, :meth:`DurableCheck.final` judges each
partition that saw durable traffic against its *final log*: the log on the simulated disk of the
leader the quorum names at the end, below that leader's commit. Violations go to the run's
sim/check.py ``Checker``, so scripts/simulate.py reports them like any other.

* leader: the member the quorum names leads the partition's log, at the quorum's epoch;
* replicas agree: every live in-sync replica holds the same records at the same offsets below
  the commit;
* acknowledged puts: a put acknowledged to its producer is in the final log; no (producer id,
  sequence) is there twice, and each producer's sequences are there in order;
* consumers: after de-duplication by offset (the application keeps the offsets it processed,
  as an offsets file would), a consumer saw each record of its topic once, in offset order, the
  same record at an offset each time, and, by the end, every record of its topic in the final
  log; it saw nothing the final log does not hold;
* cursors: a leader never serves a GET from a cursor below one committed before (a COMMIT a
  consumer may have been told is durable), and the final log's cursors are at or past every
  committed one;
* committed only: every record a consumer got was committed by a leader first.

There is no exemption for leadership: a leader is made only by the metadata quorum, only from the
in-sync replicas, so every acknowledged put must be in the final log, whatever partitions,
crashes and pauses came before.

The one limit is the promise's own: a record survives while one in-sync copy of it survives.
With ``fsync = "interval"`` (some seeds) a record is acknowledged once written on every in-sync
owner and fsynced within ``fsync_interval``, so a power loss (every crash in the simulator is
one) within that interval takes that member's copy. The simulation reports what each power loss
took from a member's disk and when each of those records was written
(:meth:`DurableCheck.power_lost`). A missing record is excused only if *every* member that held
it when a leader committed it lost it so, while its fsync was still due (within the interval,
plus the tick's slack): then no copy survived. If one holder kept it (or lost it later than its
fsync was due), the record must be in the final log: a restarted member's shorter log must not
win over a copy that survived. Under ``always`` no power loss takes an acknowledged record (it is
fsynced before its answer), so nothing is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import msgpack

from roost.cluster.partitionlog import CURSOR, MESSAGE
from roost.node.segmentlog import Record
from sim.check import Checker

RecKey = tuple[int, int, bytes]  # (partition, offset, body)


@dataclass
class Rec:
    """A record some leader committed: its leader epoch, its body, who held it on disk and when."""

    epoch: int
    body: list[Any]
    raw: bytes
    held: list[tuple[float, frozenset[str]]]  # (when a leader's commit passed it, the members holding it then)
    offset: int = -1


@dataclass
class Consumer:
    """What one consumer's application processed (across its processes)."""

    topic: str
    partition: int
    seen: dict[int, bytes] = field(default_factory=dict)  # offset -> payload
    top: int = -1  # the highest offset processed
    disorder: list[tuple[float, int, bytes]] = field(default_factory=list)  # (when, offset, payload) below top
    changed: list[tuple[float, int, bytes]] = field(default_factory=list)  # (when, offset, other payload)
    # offset -> [(when, body)]: every record a leader's answer to its GETs covered (up to ``scanned``),
    # of any topic: its read position moved past them, delivered or not
    served: dict[int, list[tuple[float, bytes]]] = field(default_factory=dict)


@dataclass
class DurableCheck:
    check: Checker
    records: dict[RecKey, Rec] = field(default_factory=dict)
    at_offset: dict[tuple[int, int], list[RecKey]] = field(default_factory=dict)
    by_seq: dict[tuple[int, bytes, int], list[RecKey]] = field(default_factory=dict)  # (p, pid, seq)
    cursors: dict[tuple[int, bytes, str], list[tuple[float, int, RecKey]]] = field(default_factory=dict)
    # (p, pid, seq) -> when the producer heard it acknowledged
    acked: dict[tuple[int, bytes, int], float] = field(default_factory=dict)
    # (p, durable id, cursor key) -> [(when, value, member)] served to a GET
    served: dict[tuple[int, bytes, str], list[tuple[float, int, str]]] = field(default_factory=dict)
    consumers: dict[int, Consumer] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=lambda: {"puts_acked": 0, "consumed": 0, "excused": 0})
    _excused: set[int] = field(default_factory=set)  # id() of the records excused (``stats``)
    # record -> the members a power loss took it from while its fsync was still due (fsync = interval)
    unsynced_lost: dict[RecKey, set[str]] = field(default_factory=dict)

    # ------------------------------------------------------------ during the run

    def committed(self, p: int, records: list[Record], holders: set[str], now: float) -> None:
        """A leader's commit passed ``records``; ``holders`` have them on disk."""
        for r in records:
            key = (p, r.offset, r.body)
            rec = self.records.get(key)
            if rec is not None:
                if not holders <= rec.held[-1][1]:
                    rec.held.append((now, frozenset(holders)))
                continue
            b = msgpack.unpackb(r.body, raw=False)
            self.records[key] = Rec(b[0], b, r.body, [(now, frozenset(holders))], r.offset)
            self.at_offset.setdefault((p, r.offset), []).append(key)
            if b[1] == MESSAGE:
                self.by_seq.setdefault((p, b[6], b[7]), []).append(key)
            elif b[1] == CURSOR:
                self.cursors.setdefault((p, b[2], b[3]), []).append((now, b[4], key))

    def power_lost(self, member: str, gone: list[tuple[int, Record, float]], now: float, within: float) -> None:
        """A power loss took ``gone`` (partition, record, when it was written) from ``member``'s disk;
        a record written less than ``within`` before (fsync = interval: its sync was not yet due) is
        lost from that member as documented (``excused`` once every holder lost it)."""
        for p, r, written in gone:
            if now - written <= within:
                self.unsynced_lost.setdefault((p, r.offset, r.body), set()).add(member)

    def put_acked(self, p: int, pid: bytes, seq: int, now: float) -> None:
        self.acked.setdefault((p, pid, seq), now)
        self.stats["puts_acked"] += 1

    def cursor_served(self, p: int, did: bytes, key: str, value: int, member: str, now: float) -> None:
        self.served.setdefault((p, did, key), []).append((now, value, member))

    def consumer(self, index: int, topic: str, p: int) -> None:
        """Consumer ``index`` reads ``topic`` of partition ``p``: by the end it must have seen all of it."""
        self.consumers.setdefault(index, Consumer(topic, p))

    def consumed(self, index: int, topic: str, p: int, offset: int, payload: bytes, now: float) -> None:
        """Consumer ``index``'s application got the record at ``offset``: new, or a repeat it drops."""
        c = self.consumers.setdefault(index, Consumer(topic, p))
        old = c.seen.get(offset)
        if old is not None:
            if old != payload:
                c.changed.append((now, offset, payload))
            return
        if offset < c.top:
            c.disorder.append((now, offset, payload))
        c.seen[offset] = payload
        c.top = max(c.top, offset)
        self.stats["consumed"] += 1

    def records_served(self, index: int, p: int, records: list[Record], now: float) -> None:
        """A leader answered a GET of consumer ``index`` with ``records`` (those it scanned)."""
        c = self.consumers.get(index)
        if c is not None and c.partition == p:
            for r in records:
                c.served.setdefault(r.offset, []).append((now, r.body))

    # ------------------------------------------------------------ the fsync policy's limit

    def excused(self, p: int, rec: Rec) -> bool:
        """May a log lack ``rec``? Only if power losses took it from every member that held it, each
        while its fsync was still due (fsync = interval, documented): no copy survived. Nothing else
        excuses a missing committed record."""
        lost = self.unsynced_lost.get((p, rec.offset, rec.raw))
        if lost is not None and frozenset().union(*(h for _, h in rec.held)) <= lost:
            self._excused.add(id(rec))
            self.stats["excused"] = len(self._excused)
            return True
        return False

    def _payload_rec(self, p: int, offset: int, topic: str, payload: bytes) -> Rec | None:
        for key in self.at_offset.get((p, offset), ()):
            rec = self.records[key]
            if rec.body[1] == MESSAGE and rec.body[2] == topic and rec.body[5] == payload:
                return rec
        return None

    # ------------------------------------------------------------ at the end

    def final(self, now: float, cores: dict[str, Any], disks: dict[str, dict[int, Any]]) -> None:
        """``cores``: id -> live MemberCore (not leaving); ``disks``: member -> partition -> SimLog."""
        parts = {k[0] for k in self.records} | {k[0] for k in self.acked}
        parts |= {c.partition for c in self.consumers.values()}
        if not parts or not cores:
            return
        meta = max((c.durable.quorum.meta for c in cores.values()), key=lambda m: m.applied)
        for p in sorted(parts):
            lead = meta.partitions.get(p)
            leader = lead.leader if lead is not None else None
            log = cores[leader].plogs.get(p) if leader is not None and leader in cores else None
            if lead is None or leader is None or log is None or log.role != "leading" or log.epoch != lead.epoch:
                self.check.violation(now, f"durable partition {p}: the quorum's leader {leader} at epoch "
                                          f"{lead.epoch if lead else None} does not lead its log after the last "
                                          "heal")  # fmt: skip
                continue
            self._final_partition(now, p, [leader, *(m for m in lead.isr if m != leader and m in cores)], log, disks)

    def _final_partition(self, now: float, p: int, owners: list[str], log: Any,
                         disks: dict[str, dict[int, Any]]) -> None:  # fmt: skip
        lead, commit = owners[0], log.commit
        mine = disks.get(lead, {}).get(p)
        final = [r for r in mine.records if r.offset < commit] if mine is not None else []
        for o in owners[1:]:
            theirs = disks.get(o, {}).get(p)
            got = [r for r in theirs.records if r.offset < commit] if theirs is not None else []
            if [(r.offset, r.body) for r in got] != [(r.offset, r.body) for r in final]:
                self.check.violation(now, f"durable partition {p}: in-sync replica {o}'s log differs from its "
                                          f"leader {lead}'s below the commit {commit}")  # fmt: skip
        at: dict[int, bytes] = {}
        seqs: dict[bytes, list[int]] = {}
        for r in final:
            at[r.offset] = r.body
            b = msgpack.unpackb(r.body, raw=False)
            if b[1] == MESSAGE:
                seqs.setdefault(b[6], []).append(b[7])
        stored = {(pid, s) for pid, ss in seqs.items() for s in ss}
        for pid, ss in sorted(seqs.items()):
            bad = next((i for i in range(1, len(ss)) if ss[i] <= ss[i - 1]), None)
            if bad is not None:
                self.check.violation(now, f"durable partition {p}: producer {pid.hex()[:8]}'s sequence {ss[bad]} "
                                          f"follows {ss[bad - 1]} in the log (twice or out of order)")  # fmt: skip
        for (q, pid, seq), when in sorted(self.acked.items()):
            if q != p or (pid, seq) in stored:
                continue
            keys = self.by_seq.get((p, pid, seq), [])
            if not keys:
                self.check.violation(now, f"durable partition {p}: put {pid.hex()[:8]}#{seq} acknowledged at "
                                          f"t={when:.3f} but no leader ever committed it")  # fmt: skip
            elif not all(self.excused(p, self.records[k]) for k in keys):
                self.check.violation(now, f"durable partition {p}: put {pid.hex()[:8]}#{seq} acknowledged at "
                                          f"t={when:.3f} is not in the final log of {lead}")  # fmt: skip
        self._final_cursors(now, p, lead, log)
        for index, c in sorted(self.consumers.items()):
            if c.partition == p:
                self._final_consumer(now, p, index, c, at, lead)

    def _final_cursors(self, now: float, p: int, lead: str, log: Any) -> None:
        for (q, did, key), events in sorted(self.cursors.items()):
            if q != p:
                continue
            have = log.state.cursors.get((did, key), -1)
            for _, value, k in events:
                if value > have and not self.excused(p, self.records[k]):
                    self.check.violation(now, f"durable partition {p}: cursor {key.split(chr(0))[0]!r} committed at "
                                              f"{value} is at {have} in the final log")  # fmt: skip
                    break
            for t, value, member in self.served.get((p, did, key), ()):
                before = [(tc, v, k) for tc, v, k in events if tc < t and v > value]
                for tc, v, k in before:
                    if not self.excused(p, self.records[k]):
                        self.check.violation(now, f"durable partition {p}: {member} served cursor "
                                                  f"{key.split(chr(0))[0]!r} from {value} at t={t:.3f}, "
                                                  f"below {v} committed at t={tc:.3f}")  # fmt: skip
                        return

    def _final_consumer(self, now: float, p: int, index: int, c: Consumer, at: dict[int, bytes],
                        lead: str) -> None:  # fmt: skip
        """The consumer's records against the final log. Only a record the fsync policy's limit
        took excuses a difference: a record it saw that the final log lacks, and a final record it
        skipped (or got out of order) because its read position had moved past that offset with
        another record there."""

        def lost(offset: int, body: bytes) -> bool:
            rec = self.records.get((p, offset, body))
            return rec is not None and self.excused(p, rec)

        def switched(offset: int, body: bytes | None, before: float = math.inf) -> bool:
            """Was it served another record at ``offset`` (before ``before``), one of the two on a cut branch?"""
            cut = body is not None and lost(offset, body)
            return any(t < before and b != body and (cut or lost(offset, b)) for t, b in c.served.get(offset, ()))

        for offset, bodies in sorted(c.served.items()):
            for t, body in bodies:
                rec = self.records.get((p, offset, body))
                if rec is None or rec.held[0][0] > t:
                    self.check.violation(now, f"durable consumer {index} was served offset {offset} of partition "
                                              f"{p} at t={t:.3f}, which no leader had committed by then")  # fmt: skip
                    return
        mine = {o: b for o, b in at.items() if _payload(b, c.topic) is not None}
        for offset, payload in sorted(c.seen.items()):
            final = mine.get(offset)
            if final is not None and _payload(final, c.topic) == payload:
                continue
            rec = self._payload_rec(p, offset, c.topic, payload)
            if rec is None or not self.excused(p, rec):
                self.check.violation(now, f"durable consumer {index} got {payload!r} at offset {offset} of "
                                          f"partition {p}, not in the final log of {lead}")  # fmt: skip
                return
        for t, offset, payload in c.changed:
            first = self._payload_rec(p, offset, c.topic, c.seen[offset])
            then = self._payload_rec(p, offset, c.topic, payload)
            if not any(r is not None and self.excused(p, r) for r in (first, then)):
                self.check.violation(now, f"durable consumer {index} got {payload!r} at offset {offset} at "
                                          f"t={t:.3f}, after {c.seen[offset]!r} there")  # fmt: skip
                return
        for t, offset, payload in c.disorder:
            rec = self._payload_rec(p, offset, c.topic, payload)
            if not switched(offset, rec.raw if rec is not None else None, t):
                self.check.violation(now, f"durable consumer {index} got offset {offset} at t={t:.3f} after a "
                                          "later one (offset order)")  # fmt: skip
                return
        for offset, body in sorted(mine.items()):
            if offset not in c.seen and not switched(offset, body):
                self.check.violation(now, f"durable consumer {index} never got offset {offset} of {c.topic!r} "
                                          f"({_payload(body, c.topic)!r}), in the final log of {lead}")  # fmt: skip
                return


def _payload(body: bytes, topic: str) -> bytes | None:
    """The payload of a message record of ``topic``; None for any other record."""
    b = msgpack.unpackb(body, raw=False)
    return b[5] if b[1] == MESSAGE and b[2] == topic else None  # type: ignore[no-any-return]
