"""The durable partition log core (cluster/partitionlog.py) directly: owners wired by a tiny
in-test network whose disks perform the actions in order, led by a tiny metadata quorum
(cluster/controller.py's ``Metadata``) that every live owner learns each decision of, in order;
fake time."""

from __future__ import annotations

from collections import deque
from typing import Any

import msgpack
import pytest

from roost.cluster.controller import Leadership, Metadata, SetPartition, alter_isr, decide_one, decline, reelect
from roost.cluster.logreaders import NOT_LEADER, STALE
from roost.cluster.logrecords import LogScan, message_body
from roost.cluster.partitionlog import (
    CURSOR,
    FOLLOWING,
    IDLE,
    LEADING,
    AlterIsr,
    Append,
    Checkpoint,
    Committed,
    Decline,
    LogFormatError,
    LogSettings,
    PartitionLog,
    PeerFrame,
    ReadDone,
    ReadLog,
    Recovered,
    Reelect,
    Reload,
    ResetLog,
    Truncate,
    decode_untrusted_body,
)
from roost.node.segmentlog import Record


class Owners:
    """Members' partition-0 logs, their disks (lists of records), a FIFO network, a metadata quorum
    (``meta``: ``elect`` decides; the leader's ``AlterIsr`` and ``Reelect`` are decided as the
    controller would, unless ``quorum_open`` is False: then they wait in ``requests``), and time."""

    def __init__(self, names: str, **settings: Any) -> None:
        self.s = LogSettings(**settings)
        self.logs = {m: PartitionLog(0, m, self.s) for m in names}
        self.disk: dict[str, list[Record]] = {m: [] for m in names}
        self.checkpoint: dict[str, int] = {m: 0 for m in names}  # each disk's commit checkpoint (Checkpoint)
        self.start: dict[str, int] = {m: 0 for m in names}  # where each disk's log begins (ResetLog, retention)
        self.reloads = 0
        self.queue: deque[tuple[str, Any]] = deque()
        self.down: set[str] = set()
        self.committed: dict[str, list[Any]] = {m: [] for m in names}
        self.reads: list[ReadDone] = []
        self.now = 0.0
        self.meta = Metadata()
        self.index = 0
        self.told: dict[str, int] = {m: 0 for m in names}  # the leadership version each member was told
        self.quorum_open = True
        self.unwritten: set[str] = set()  # members whose Appends never reach their disk (they die first)
        self.deaf: set[str] = set()  # members cut off from the quorum (not from each other): told nothing
        self.requests: list[tuple[str, AlterIsr | Reelect | Decline | Recovered]] = []
        self.reports: dict[str, tuple[int, int]] = {}  # the controller's: who declined, with its log's end

    @property
    def lead(self) -> Leadership:
        return self.meta.partitions[0]

    def feed(self, member: str, actions: list[Any]) -> None:
        for a in actions:
            self.queue.append((member, a))

    def run(self, limit: int = 10_000) -> None:
        for _ in range(limit):
            if not self.queue:
                return
            member, a = self.queue.popleft()
            if member in self.down:
                continue
            log = self.logs[member]
            disk = self.disk[member]
            if isinstance(a, Append) and member in self.unwritten:
                continue
            if isinstance(a, Append):
                assert a.records[0].offset == (disk[-1].offset + 1 if disk else log.start)
                disk.extend(a.records)
                self.feed(member, log.appended(disk[-1].offset + 1, self.now))
            elif isinstance(a, Truncate | Reload):
                disk[:] = [r for r in disk if r.offset < a.to]
                self.reloads += isinstance(a, Reload)
                self.feed(member, log.reloaded(self.scan(member), self.now) if isinstance(a, Reload)
                          else log.appended(a.to, self.now))  # fmt: skip
            elif isinstance(a, ResetLog):
                disk.clear()
                self.start[member] = a.start
                self.feed(member, log.appended(a.start, self.now))
            elif isinstance(a, Checkpoint):  # (the core says what it holds: the disk only keeps it)
                self.checkpoint[member] = a.commit
            elif isinstance(a, ReadLog):
                recs = [r for r in disk if (r.offset >= a.start if a.at_time < 0 else r.time_ms >= a.at_time)]
                recs = recs[: a.limit]
                self.feed(member, log.read_done(a.token, recs))
            elif isinstance(a, Committed):
                self.committed[member].extend(a.tokens)
            elif isinstance(a, ReadDone):
                self.reads.append(a)
            elif isinstance(a, PeerFrame):
                self.deliver(member, a)
            elif isinstance(a, AlterIsr | Reelect | Decline | Recovered):
                self.requests.append((member, a))
                if self.quorum_open:
                    self.decide(member, a)
        raise AssertionError("no quiescence")

    def decide(self, member: str, a: AlterIsr | Reelect | Decline | Recovered) -> None:
        """The controller turns a leader's request into a command (cluster/controller.py)."""
        if isinstance(a, Recovered):
            self.reports.pop(member, None)
            c = None
        elif isinstance(a, Decline):
            if member in self.lead.isr:
                self.reports[member] = (a.last_epoch, a.end)
            c = decline(self.meta, 0, member, self.reports, frozenset(self.logs) - self.down)
        elif isinstance(a, Reelect):
            c = reelect(self.meta, 0, member, a.epoch, a.at_least)
        elif a.version == self.lead.version:  # (an AlterIsr against an older version does not apply)
            c = alter_isr(self.meta, 0, member, a.epoch, a.isr)
        else:
            c = None
        if c is not None:
            self.apply(c)

    def apply(self, c: SetPartition) -> None:
        """The quorum commits ``c``: every live member applies it (a down one learns it when back).
        One the metadata's rules refuse (a test of the log that needs a state no controller makes)
        is set as it is: these tests are of the log, cluster/controller.py's rules have their own."""
        self.index += 1
        if self.meta.apply(self.index, c.encode()) is None:
            self.meta.partitions[0] = Leadership(c.replicas, c.leader, c.epoch, c.isr, c.version + 1)
        for m in self.logs:
            self.tell(m)

    def tell(self, member: str) -> None:
        if member not in self.down | self.deaf and 0 in self.meta.partitions and self.told[member] != self.lead.version:
            self.told[member] = self.lead.version
            self.feed(member, self.logs[member].lead(self.lead, self.now))

    def elect(self, leader: str | None, isr: str | None = None, replicas: str | None = None) -> None:
        """The quorum decides: ``leader`` leads (its epoch rises if it is another), with ``isr`` (by
        default the current one, or all the replicas) and ``replicas`` (by default the current ones,
        or the ISR); a new leader that may not begin its epoch asks again (``Reelect``) and the
        quorum gives it the next one."""
        now = self.meta.partitions.get(0)
        reps = tuple(replicas) if replicas else (now.replicas if now else tuple(isr or ""))
        ins = tuple(isr) if isr else (tuple(m for m in now.isr if m in reps) if now else reps)
        epoch = 1 if now is None else now.epoch + (leader != now.leader)
        self.apply(SetPartition(0, now.version if now else 0, leader, epoch, ins, reps))
        self.run()

    def tick(self, dt: float) -> None:
        self.now += dt
        for m, log in self.logs.items():
            if m not in self.down:
                self.tell(m)
                self.feed(m, log.tick(self.now))
        self.run()

    def deliver(self, sender: str, a: PeerFrame) -> None:
        if a.member in self.down:
            return
        to = self.logs[a.member]
        f = a.frame
        if f[0] == "FETCH":
            assert len(f) == 5
            self.feed(a.member, to.on_fetch(sender, f[2], f[3], f[4], self.now))
        else:
            recs = [Record(o, t, b) for o, t, b in f[10]]
            epoch, status, start, end, last_epoch, commit, truncate, reset = f[2:10]
            self.feed(a.member, to.on_data(sender, epoch, status, start, end, last_epoch, commit, truncate, reset,
                                           recs, f[11], self.now))  # fmt: skip

    def put(self, member: str, payloads: list[str], pid: bytes = b"p1", first: int = 1, token: Any = None,
            ms: int = 5000) -> int:  # fmt: skip
        msgs = [["t", None, None, x.encode()] for x in payloads]
        status, actions = self.logs[member].put(msgs, pid, first, 1, lambda last: first if token is None else token,
                                                ms)  # fmt: skip
        self.feed(member, actions)
        self.run()
        return status

    def commit_cursor(self, member: str, cid: bytes, name: str, offset: int) -> None:
        st, acts = self.logs[member].commit_cursor(cid, name, offset, None, 5000)
        assert st == 0
        self.feed(member, acts)
        self.run()

    def payloads(self, member: str) -> list[bytes]:
        return [b[5] for b in (msgpack.unpackb(r.body, raw=False) for r in self.disk[member]) if b[1] == 0]

    def crash(self, member: str) -> None:
        self.down.add(member)

    def pause(self, member: str) -> None:
        """``member`` stands still: it hears and says nothing, and keeps its state."""
        self.down.add(member)

    def resume(self, member: str) -> None:
        """``member`` goes on where it stood, and learns what the quorum decided meanwhile."""
        self.down.discard(member)
        self.deaf.discard(member)
        self.tell(member)
        self.run()

    def restart(self, member: str) -> None:
        """``member`` starts again from its disk and learns the quorum's leadership."""
        self.down.discard(member)
        self.logs[member] = PartitionLog(0, member, self.s, restarted=True)
        self.logs[member].recovered(self.scan(member))
        self.told[member] = 0
        self.tell(member)
        self.run()

    def scan(self, member: str) -> LogScan:
        disk = self.disk[member]
        return LogScan.of(disk[0].offset if disk else self.start[member], list(disk), self.s.keep,
                          self.checkpoint[member])  # fmt: skip

    def retain(self, member: str, start: int) -> None:
        """Retention deleted every record before ``start`` from ``member``'s disk."""
        self.logs[member].retained(start)
        self.disk[member] = [r for r in self.disk[member] if r.offset >= start]
        self.start[member] = start


def test_a_put_is_committed_only_once_the_follower_has_it_on_disk() -> None:
    o = Owners("ab")
    o.elect("a", "ab")
    assert (o.logs["a"].role, o.logs["b"].role) == (LEADING, FOLLOWING)
    o.down.add("b")  # the follower hears nothing
    assert o.put("a", ["m1"], token="t1") == 0
    assert o.committed["a"] == []  # on a's disk only
    assert o.payloads("a") == [b"m1"]
    o.down.discard("b")
    o.tick(2.0)  # b fetches again
    assert o.committed["a"] == ["t1"]
    assert o.payloads("b") == [b"m1"]
    assert o.logs["a"].commit == o.logs["a"].end


def test_a_single_replica_commits_on_its_own_disk() -> None:
    """min_insync counts replicas that exist: a partition of one replica (a one-member cluster, or
    replicas = 1) commits alone; the ISR of a replicated one is never that small (next test)."""
    o = Owners("a")
    o.elect("a", "a")
    assert o.put("a", ["x", "y"], token="t") == 0
    assert o.committed["a"] == ["t"]


def test_puts_are_refused_as_busy_while_fewer_than_min_insync_are_in_sync() -> None:
    o = Owners("abc", min_insync=2)
    o.down.add("b")
    o.elect("a", "a", replicas="ab")  # (b not in sync yet: only a counts)
    a = o.logs["a"]
    assert a.role == LEADING and o.put("a", ["m1"], token="t1") == 2 and o.payloads("a") == []
    st, acts = a.commit_cursor(b"c", "s", 1, "cur", 5000)
    o.feed("a", acts)
    o.run()
    assert st == 0 and o.committed["a"] == []  # (a cursor is taken, but not committed either)
    o.down.discard("b")
    o.tick(1.1)  # b is woken, fetches, reaches the commit: a asks to add it and counts it at once
    assert [type(x) for _, x in o.requests] == [Reelect, AlterIsr] and o.lead.isr == ("a", "b")
    assert o.put("a", ["m1"], token="t1") == 0 and "t1" in o.committed["a"]


def test_a_retried_put_is_stored_once_and_acknowledged_again() -> None:
    o = Owners("ab")
    o.elect("a", "ab")
    o.put("a", ["m1", "m2"], first=1, token="first")
    o.put("a", ["m1", "m2", "m3"], first=1, token="retry")
    assert o.payloads("a") == [b"m1", b"m2", b"m3"]
    assert o.committed["a"] == ["first", "retry"]
    assert o.put("a", ["m2"], first=2, token="dup") == 0  # all old: acknowledged, nothing written
    assert o.committed["a"][-1] == "dup"
    assert o.payloads("b") == [b"m1", b"m2", b"m3"]


def test_a_gap_is_refused_and_not_a_leader_is_refused() -> None:
    o = Owners("ab")
    o.elect("a", "ab")
    o.put("a", ["m1"], first=1)
    assert o.put("a", ["m5"], first=5) == 3
    assert o.put("b", ["m2"], first=2) == 1
    assert o.payloads("a") == [b"m1"]


def test_uncommitted_puts_are_bounded() -> None:
    o = Owners("ab", max_uncommitted=3)
    o.elect("a", "ab")
    o.crash("b")
    assert o.put("a", ["1", "2"], first=1) == 0
    assert o.put("a", ["3", "4"], first=3) == 0  # (room for one more: "3" is taken)
    assert o.put("a", ["4"], first=4) == 2  # (3 uncommitted: busy)
    assert o.payloads("a") == [b"1", b"2", b"3"]


def test_a_put_larger_than_the_room_left_is_taken_in_part_and_acknowledged_as_far_as_taken() -> None:
    o = Owners("ab", max_uncommitted=4)
    o.elect("a", "ab")
    o.down.add("b")  # (nothing commits past the EPOCH record b has)
    msgs = [["t", None, None, b"m%d" % i] for i in range(1, 11)]
    a = o.logs["a"]
    status, actions = a.put(msgs, b"p1", 1, 1, lambda last: ("acked", last), 5000)
    o.feed("a", actions)
    o.run()
    assert status == 0 and (a.commit, a.end) == (1, 5) and a.state.producers[b"p1"][0] == 4
    assert a.put(msgs[4:], b"p1", 5, 1, lambda last: last, 5000)[0] == 2  # (full: busy)
    o.down.discard("b")
    o.tick(1.0)
    assert o.committed["a"] == [("acked", 4)]


def test_failover_keeps_every_committed_record_and_a_new_replica_copies_them_and_joins() -> None:
    o = Owners("abc")
    o.down.add("c")  # (c is no ISR member: it is not waited for)
    o.elect("a", "ab", replicas="abc")
    for i in range(1, 6):
        o.put("a", [f"m{i}"], first=i, token=i)
    assert o.committed["a"] == [1, 2, 3, 4, 5]
    o.crash("a")
    o.down.discard("c")
    o.elect("b", "b")  # (the controller: a dead leader leaves the ISR when another takes over)
    b = o.logs["b"]
    assert b.role == LEADING and b.epoch > o.logs["a"].epoch
    o.tick(1.1)  # (c fetches, catches up, and b asks to add it)
    assert o.payloads("c") == [b"m1", b"m2", b"m3", b"m4", b"m5"] and o.lead.isr == ("b", "c")
    o.put("b", ["m6"], first=6, token=6)
    assert o.committed["b"] == [6]
    assert o.payloads("c")[-1] == b"m6"


def test_a_returning_leader_with_an_uncommitted_tail_truncates_it_and_follows() -> None:
    o = Owners("abc")
    o.elect("a", "abc")
    o.put("a", ["m1"], first=1, token=1)
    o.crash("b")
    o.crash("c")
    o.put("a", ["lost2", "lost3"], first=2, token=2)  # never committed, never acknowledged
    assert o.committed["a"] == [1]
    o.crash("a")
    o.down -= {"b", "c"}
    o.elect("b", "bc")
    o.put("b", ["m2"], first=2, token="b2")
    assert o.committed["b"] == ["b2"]
    o.restart("a")
    o.tick(1.1)
    a = o.logs["a"]
    assert a.role == FOLLOWING and o.lead.isr == ("a", "b", "c")  # (caught up: b added it)
    assert o.payloads("a") == [b"m1", b"m2"]  # the uncommitted tail is cut, b's records copied
    assert o.payloads("b") == [b"m1", b"m2"]
    assert a.state.producers[b"p1"][0] == 2  # producer state rebuilt after the cut


def test_a_returning_preferred_leader_copies_what_it_missed_then_leads() -> None:
    o = Owners("abc")
    o.elect("a", "abc")
    o.put("a", ["m1"], first=1, token=1)
    o.crash("a")
    o.elect("b", "bc")
    o.put("b", ["m2", "m3"], first=2, token="b")
    o.restart("a")
    o.tick(1.1)
    assert o.lead.isr == ("a", "b", "c")
    o.elect("a")  # (the controller: the preferred replica is in sync again)
    assert (o.logs["a"].role, o.logs["b"].role) == (LEADING, FOLLOWING)
    assert o.payloads("a") == [b"m1", b"m2", b"m3"]
    assert o.put("a", ["m3", "m4"], first=3, token="a") == 0  # m3 is a duplicate already stored
    assert o.payloads("b") == [b"m1", b"m2", b"m3", b"m4"]
    assert o.committed["a"][-1:] == ["a"]


def test_a_paused_leader_fenced_by_a_new_epoch_never_acknowledges_its_pending_puts() -> None:
    o = Owners("abc")
    o.elect("a", "abc")
    o.put("a", ["m1"], first=1, token="a1")
    o.down.update("bc")
    o.put("a", ["pending"], first=2, token="never")
    o.down -= {"b", "c"}
    o.pause("a")
    o.elect("b", "bc")  # (a is not live to the controller)
    o.put("b", ["b2"], pid=b"p2", token="b2")
    assert o.committed["b"] == ["b2"]
    o.now += 3.0
    o.deaf.add("a")
    o.down.discard("a")  # a goes on leading at its old epoch, not yet told
    a = o.logs["a"]
    assert a.role == LEADING and a.epoch < o.lead.epoch
    assert o.put("a", ["x"], pid=b"p3", token="x") == 0
    o.tick(1.1)  # (its wake-up FETCHes reach b and c, which answer that a does not lead)
    assert "never" not in o.committed["a"] and "x" not in o.committed["a"] and not a.readable(o.now)
    o.resume("a")
    o.tick(1.1)
    assert a.role == FOLLOWING and o.payloads("a") == [b"m1", b"b2"]  # (its tail is cut)
    assert "never" not in o.committed["a"] and "x" not in o.committed["a"]


def test_a_follower_behind_the_leaders_retention_resets() -> None:
    o = Owners("ab")
    o.down.add("b")
    o.elect("a", "a")
    for i in range(1, 4):
        o.put("a", [f"m{i}"], first=i)
    o.retain("a", 3)  # (retention deleted offsets 0..2)
    o.down.discard("b")
    o.elect("a", "a", replicas="ab")
    assert o.disk["b"][0].offset == 3 and o.start["b"] == 3
    assert o.logs["b"].end == o.logs["a"].end and o.lead.isr == ("a", "b")


def test_a_follower_far_behind_the_cache_is_served_from_disk() -> None:
    o = Owners("ab", cache_records=2, max_uncommitted=2)
    o.down.add("b")
    o.elect("a", "a")
    for i in range(1, 9):
        o.put("a", [f"m{i}"], first=i)
    assert o.logs["a"].base_at > 0  # folded out of the cache
    o.down.discard("b")
    o.elect("a", "a", replicas="ab")
    o.tick(1.1)
    assert o.payloads("b") == [f"m{i}".encode() for i in range(1, 9)]


def test_recovery_rebuilds_epochs_producers_and_cursors() -> None:
    o = Owners("a")
    o.elect("a", "a")
    o.put("a", ["x", "y"], first=1)
    st, acts = o.logs["a"].commit_cursor(b"c1", "d", 2, "cur", 5000)
    o.feed("a", acts)
    o.run()
    assert st == 0 and o.committed["a"][-1] == "cur"
    st, acts = o.logs["a"].commit_cursor(b"c1", "d", 1, "back", 5000)  # never backwards
    o.feed("a", acts)
    o.run()
    assert o.logs["a"].state.cursors[(b"c1", "d")] == 2
    epoch = o.logs["a"].epoch
    o.crash("a")
    o.restart("a")
    a = o.logs["a"]
    assert a.state.producers[b"p1"][0] == 2
    assert a.state.cursors[(b"c1", "d")] == 2
    assert a.epochs[0] == (epoch, 0) and a.epochs[-1][0] > epoch  # (it led again at a new epoch: Reelect)
    assert len([r for r in o.disk["a"] if msgpack.unpackb(r.body)[1] == CURSOR]) == 1


def test_a_fetch_answer_with_a_bad_record_body_takes_none_of_its_records() -> None:
    o = Owners("ab")
    o.elect("a", "ab")
    b = o.logs["b"]
    end = b.end
    good = Record(end, 1, msgpack.packb([1, 0, "t", None, None, b"x", b"P" * 16, 1]))
    bad = Record(end + 1, 1, b"\xc1")
    with pytest.raises(LogFormatError):
        b.on_data("a", b.epoch, 0, 0, end + 2, b.last_epoch, end, -1, -1, [good, bad], end, o.now)
    assert (b.end, b.appending) == (end, 0)  # (nothing taken: the next fetch asks from the same end)


def test_recovery_in_chunks_keeps_the_state_of_every_record_and_only_the_newest_in_memory() -> None:
    o = Owners("a", cache_records=100, max_uncommitted=10)
    o.elect("a", "a")
    for i in range(1, 301):
        o.put("a", [f"m{i}"], first=i)
    o.commit_cursor("a", b"c1", "d", 5)
    whole = LogScan.of(0, o.disk["a"])
    chunked = LogScan(0, o.s.keep)
    for i in range(0, len(o.disk["a"]), 7):
        chunked.feed(o.disk["a"][i : i + 7])
    assert (chunked.state, chunked.epochs, chunked.end) == (whole.state, whole.epochs, whole.end)
    assert len(chunked.tail) == 100 and chunked.base_at == chunked.end - 100
    o.crash("a")
    o.restart("a")
    a = o.logs["a"]
    # (the commit checkpoint: the commit when the last record, the cursor, was appended; then a
    # led again, and its EPOCH committed everything)
    assert (a.state.producers[b"p1"][0], a.state.cursors[(b"c1", "d")]) == (300, 5)
    assert a.read_committed(0, 5, "t")[0] is None  # (older than the cache: read from disk)


def test_retention_never_takes_uncommitted_records_or_a_cursors_only_record() -> None:
    o = Owners("ab")
    o.elect("a", "ab")
    o.put("a", ["x", "y"], first=1)
    o.commit_cursor("a", b"c1", "d", 2)  # (its record is at offset 3)
    for i in range(3, 9):
        o.put("a", [f"m{i}"], first=i)
    a = o.logs["a"]
    assert a.retain_limit() == 3
    o.down.add("b")
    o.put("a", ["late"], first=9)  # (not committed without b)
    assert a.end == 11 and a.commit == 10
    a.retained(3)  # (the runner deleted what it was allowed to: offsets 0..2)
    assert (a.start, a.read_committed(0, 100, "t")[0][0].offset) == (3, 3)
    # retention wanted to go to 8: the leader writes the cursor again at the end, and then it may
    o.down.discard("b")
    o.tick(1.0)
    o.feed("a", a.refresh_cursors(8, 6000))
    o.run()
    assert a.state.cursors[(b"c1", "d")] == 2 and a.state.cursor_at[(b"c1", "d")] == 11
    assert (a.retain_limit(), a.commit) == (11, 12)  # (past the 8 retention wanted: nothing holds it back)
    assert o.logs["b"].state.cursor_at[(b"c1", "d")] == 11  # (the follower has it too)
    assert o.logs["b"].refresh_cursors(20, 6000) == []  # (only the leader writes)


def test_the_first_offset_at_a_time_comes_from_the_cache_or_from_disk() -> None:
    o = Owners("a", cache_records=3, max_uncommitted=2)
    o.elect("a", "a")  # (EPOCH at offset 0, time 0)
    for i in range(1, 11):
        o.put("a", [f"m{i}"], first=i, ms=1000 + 10 * i)  # (m_i at offset i, time 1000 + 10 i)
    a = o.logs["a"]
    assert a.base_at > 5
    assert a.first_at(1095, "t") == (10, []) and a.first_at(5000, "t") == (a.commit, [])
    off, actions = a.first_at(1025, "seek")  # (older than the cache: the record on disk, then ReadDone)
    assert off is None and [(x.at_time, x.token) for x in actions] == [(1025, "seek")]
    o.feed("a", actions)
    o.run()
    assert [(d.token, [r.offset for r in d.records]) for d in o.reads] == [("seek", [3])]


@pytest.mark.parametrize("body", [b"\xc1", msgpack.packb([0, 0]), msgpack.packb([1, 9]),
                                  msgpack.packb([1, 0, "t", None, None, b"x", "pid", 1])])  # fmt: skip
def test_a_malformed_record_body_is_refused(body: bytes) -> None:
    with pytest.raises(LogFormatError):
        decode_untrusted_body(body)


def test_a_producer_acknowledged_past_what_a_log_holds_is_taken_from_its_floor() -> None:
    """Simulator seed 6: after a branch that held a producer's acknowledged puts was cut (both owners
    lost: not promised), every new put of it was refused as a gap, for ever."""
    o = Owners("a")
    o.elect("a", "a")
    o.put("a", ["m1"], first=1)
    status, actions = o.logs["a"].put([["t", None, None, b"m9"]], b"p1", 9, 9, lambda last: "t9", 5000)
    o.feed("a", actions)
    o.run()
    assert status == 0 and o.payloads("a") == [b"m1", b"m9"] and o.committed["a"][-1] == "t9"
    status, _ = o.logs["a"].put([["t", None, None, b"m11"]], b"p1", 11, 10, lambda last: "t11", 5000)
    assert status == 3  # (a gap is a gap)


def test_a_restarted_owner_serves_only_what_its_checkpoint_says_was_committed() -> None:
    """Records past the recovered commit checkpoint are not served until they are committed again."""
    bodies = [message_body(1, ["t", None, None, b"m%d" % i], b"p", i + 1) for i in range(5)]
    recs = [Record(i, 1000 + i, b) for i, b in enumerate(bodies)]
    log = PartitionLog(0, "a", LogSettings(max_uncommitted=2))
    log.recovered(LogScan.of(0, recs, LogSettings().keep, commit=2))
    assert log.commit == 2  # (not end - max_uncommitted = 3)
    got, _ = log.read_committed(0, 10, "t")
    assert got is not None and [r.offset for r in got] == [0, 1]


def test_a_leader_wakes_a_follower_that_never_fetched() -> None:
    """Simulator seed 8: a member that joined became a partition's replica, but its log was not
    active (nothing had reached it), so it never fetched and nothing committed."""
    o = Owners("ab")
    o.deaf.add("b")  # (b does not know yet: its log is not active)
    o.elect("a", "a", replicas="ab")
    a = o.logs["a"]
    assert a.next_deadline() <= o.now + a.s.fetch_retry  # (it wakes for that)
    frames = [x for x in a.tick(o.now + a.s.fetch_retry) if isinstance(x, PeerFrame)]
    assert [(f.member, f.frame[0]) for f in frames] == [("b", "FETCH")]  # (it makes b's log active)
    o.resume("b")
    assert a.followers["b"] >= 0  # (b fetches: not woken again while it does)
    assert not [x for x in a.tick(o.now + a.s.fetch_retry / 2) if isinstance(x, PeerFrame) and x.frame[0] == "FETCH"]


# ---------------------------------------------------------------- the reader lease


def test_a_leader_serves_readers_only_while_its_in_sync_followers_fetch_from_it() -> None:
    """Found by a chaos run (dur.b, seed 7), kept under the quorum: a paused leader resumes still
    leading at its old epoch, with cursors older than one committed at the new leader meanwhile. A
    leader serves readers only while every follower it counts in sync fetched from it at its epoch
    within fetch_wait + fetch_retry: the new leader came from that ISR and fetches from it no more."""
    o = Owners("abc")
    o.elect("a", "abc")
    o.put("a", ["m1", "m2", "m3"], first=1)
    a = o.logs["a"]
    assert a.readable(o.now)
    o.pause("a")
    o.elect("b", "bc")
    st, acts = o.logs["b"].commit_cursor(b"c1", "d", 4, "cur", 5000)
    o.feed("b", acts)
    o.run()
    assert st == 0 and o.committed["b"] == ["cur"]
    o.now += 3.0  # a resumes 3 s later, still leading at its old epoch (not told yet), without that cursor
    o.deaf.add("a")
    o.down.discard("a")
    assert a.role == LEADING and (b"c1", "d") not in a.state.cursors
    assert not a.readable(o.now)
    o.tick(0.5)  # (its wake-up fetches are answered NOT_LEADER: no lease)
    assert not a.readable(o.now)
    o.resume("a")  # a follows b, copies the cursor, joins the ISR; the preferred replica leads again
    o.tick(1.1)
    o.elect("a")
    assert a.role == LEADING and a.state.cursors[(b"c1", "d")] == 4
    assert a.readable(o.now)  # (b's and c's fetches at a's new epoch)
    o.tick(1.0)  # (they keep fetching: the lease holds)
    assert a.readable(o.now)


def test_fetches_read_in_the_burst_after_a_pause_do_not_renew_the_read_lease() -> None:
    """Found by a chaos run (dur.f, seed 11): the follower's fetches sent just before the leader
    was paused waited in its socket and were read in a burst when it resumed, renewing the lease of
    a leader the follower had left meanwhile. A log told of a local pause takes no lease from
    fetches read within fetch_retry after it."""
    o = Owners("ab")
    o.elect("a", "ab")
    o.put("a", ["m1"], first=1)
    a = o.logs["a"]
    o.tick(0.6)
    assert a.readable(o.now)
    epoch, end, last_epoch = a.epoch, a.end, a.last_epoch  # (a fetch b sent before a stood still)
    o.now += 4.0  # a resumes 4 s later and notices it
    a.paused(o.now)
    o.feed("a", a.on_fetch("b", epoch, end, last_epoch, o.now))  # read from the socket in the burst
    o.run()
    assert not a.readable(o.now)
    o.tick(1.5)  # b's fetches since then are fresh
    assert a.readable(o.now)
    single = Owners("a")
    single.elect("a", "a")
    assert single.logs["a"].readable(single.now)  # (one replica: nobody else can lead, it reads alone)


# ---------------------------------------------------------------- the ISR


def test_a_lagging_follower_leaves_the_isr_after_isr_lag_time_but_never_below_min_insync() -> None:
    """A member cut off from the others keeps leading (the quorum sees it) but commits nothing with
    min_insync 2: it drops one silent follower, never the last, and its deadline does not spin."""
    o = Owners("abc", isr_lag_time=10.0)
    o.elect("a", "abc")
    o.put("a", ["m1"], first=1, token="a1")
    a = o.logs["a"]
    o.down.update("bc")  # (cut off: b and c hear nothing, but the quorum still hears a)
    assert o.put("a", ["m2"], first=2, token="a2") == 0
    o.tick(9.0)
    assert o.lead.isr == ("a", "b", "c")  # (not yet)
    o.tick(2.0)
    assert o.lead.isr == ("a", "c") and a.isr == {"c"}  # (b dropped: a and c are still min_insync)
    for _ in range(5):
        o.tick(5.0)
    assert o.lead.isr == ("a", "c") and o.committed["a"] == ["a1"]  # (c is never dropped: nothing commits)
    assert a.next_deadline() > o.now  # (a follower it may not drop wakes it no more)
    assert o.put("a", ["m3"], first=3, token="a3") == 0  # (taken: two counted; committed once c is back)
    o.down.discard("c")
    o.tick(1.1)
    assert o.committed["a"] == ["a1", "a2", "a3"] and o.payloads("c") == [b"m1", b"m2", b"m3"]


def test_a_follower_stays_counted_until_the_quorum_decides_to_drop_it() -> None:
    """A shrink takes effect at the next leadership version only: until then a put waits for it."""
    o = Owners("abc", isr_lag_time=2.0)
    o.elect("a", "abc")
    a = o.logs["a"]
    o.down.add("b")
    o.quorum_open = False
    o.tick(2.5)
    assert [x for _, x in o.requests][-1] == AlterIsr(0, a.epoch, o.lead.version, ("a", "c"))
    o.put("a", ["m1"], token="t1")
    assert o.committed["a"] == []  # (b is still counted)
    o.tick(1.1)  # (undecided: asked again)
    assert [x for _, x in o.requests][-2:] == [AlterIsr(0, a.epoch, o.lead.version, ("a", "c"))] * 2
    o.quorum_open = True
    o.decide("a", o.requests[-1][1])
    o.run()
    assert o.lead.isr == ("a", "c") and o.committed["a"] == ["t1"]


def test_a_follower_asked_to_be_added_is_counted_at_once_and_until_a_newer_version() -> None:
    """Kafka's maximal ISR: the leader counts a follower it asked to add before the quorum decides
    (so the quorum's ISR is never larger than the one it counts); a refused add counts no more."""
    o = Owners("abc")
    o.down.add("c")
    o.elect("a", "ab", replicas="abc")
    a = o.logs["a"]
    o.quorum_open = False
    o.down.discard("c")
    o.tick(1.1)  # (c is woken, fetches, reaches the commit: a asks to add it at the fetch)
    assert o.requests[-1] == ("a", AlterIsr(0, a.epoch, o.lead.version, ("a", "b", "c")))
    assert a.adding == {"c"} and o.lead.isr == ("a", "b")
    o.tick(1.1)  # (undecided: asked again)
    assert o.requests[-2:] == [o.requests[-1]] * 2 and len(o.requests) == 3
    o.down.add("c")
    o.put("a", ["m1"], token="t1")
    assert o.committed["a"] == []  # (c counts: a put waits for it)
    o.elect("a", "ab")  # (another change of the leadership came first: a's request is refused)
    o.quorum_open = True
    o.run()
    assert a.adding == set() and o.committed["a"] == ["t1"]


def test_a_parked_fetch_answered_later_moves_the_caught_up_mark() -> None:
    """isr_lag_time counts from the last fetch that reached the leader's end when it last answered:
    an answer to a parked fetch is one (a follower served 2 records of 10 is not caught up)."""
    o = Owners("ab", fetch_records=2)
    o.elect("a", "ab")
    a, b = o.logs["a"], o.logs["b"]
    assert "b" in a.parked
    end = b.end
    st, acts = a.put([["t", None, None, b"m%d" % i] for i in range(10)], b"p", 1, 1, lambda s: s, 5000)
    assert st == 0 and [x.frame[0] for x in acts if isinstance(x, PeerFrame)] == ["DATA"]
    seen = a.caught_up["b"]
    assert a.on_fetch("b", a.epoch, end + 2, a.epoch, 7.0)  # (b took those 2)
    assert a.followers["b"] == end + 2
    assert a.caught_up["b"] == seen  # (behind the 10: not caught up)


# ---------------------------------------------------------------- epochs


def test_fetches_and_answers_are_fenced_by_the_epoch_both_ways() -> None:
    o = Owners("abc")
    o.elect("a", "abc")
    a, b = o.logs["a"], o.logs["b"]
    e = a.epoch
    o.put("a", ["m1"], token="t1")
    fetched = dict(a.followers), dict(a.fetched_at)
    (hi,) = a.on_fetch("b", e + 1, b.end, b.last_epoch, o.now + 1)  # (b knows a newer leadership)
    (lo,) = a.on_fetch("b", e - 1, b.end, b.last_epoch, o.now + 1)  # (b is behind)
    assert (hi.frame[3], lo.frame[3]) == (NOT_LEADER, STALE) and (a.followers, a.fetched_at) == fetched
    (idle,) = b.on_fetch("c", e, 0, 0, o.now)  # (b does not lead)
    assert idle.frame[3] == NOT_LEADER
    rec = Record(b.end, 5000, message_body(e + 1, ["t", None, None, b"x"], b"p", 1))
    end = b.end
    for epoch in (e - 1, e + 1):  # (an answer at another epoch than the one b follows is not taken)
        assert b.on_data("a", epoch, 0, 0, end + 1, e + 1, end + 1, -1, -1, [rec], end, o.now) == []
    assert b.end == end


def test_a_leadership_older_than_the_one_told_is_ignored() -> None:
    o = Owners("ab")
    o.elect("a", "ab")
    old = o.lead
    o.elect("b")
    b = o.logs["b"]
    assert b.lead(old, o.now) == [] and b.role == LEADING and b.leadership == o.lead


def test_a_restarted_leader_the_quorum_still_names_asks_for_a_new_epoch() -> None:
    o = Owners("ab")
    o.elect("a", "ab")
    o.put("a", ["m1"], token="t1")
    a = o.logs["a"]
    e = a.epoch
    o.crash("a")
    o.quorum_open = False
    o.restart("a")
    a = o.logs["a"]
    assert a.role == IDLE and o.requests[-1] == ("a", Reelect(0, e, e + 1)) and o.lead.epoch == e
    assert a.on_fetch("b", e, 2, e, o.now)[0].frame[3] == NOT_LEADER and a.put([], b"p", 1, 1, str, 0)[0] == 1
    o.tick(1.1)  # (asked again until decided)
    assert o.requests[-1] == ("a", Reelect(0, e, e + 1))
    o.quorum_open = True
    o.decide(*o.requests[-1])
    o.run()
    assert a.role == LEADING and a.epoch == e + 1 and a.epochs[-1] == (e + 1, 2)
    assert o.put("a", ["m2"], first=2, token="t2") == 0 and o.committed["a"][-1] == "t2"


def test_a_restarted_leader_whose_disk_lost_its_epoch_does_not_begin_it_again() -> None:
    """A leader serves its followers from memory, before its own write is on disk: it died before,
    and came back with none of its epoch's records while its follower held them. Beginning that
    epoch again would put other records at the same offsets and epoch (no fetch could tell them
    apart); the first leadership a log is told in a life is never begun: a new epoch is asked."""
    o = Owners("ab")
    o.elect("a", "ab")
    o.put("a", ["m1"], token="t1")
    o.unwritten.add("a")  # (a's writes from now on never reach its disk)
    e = o.lead.epoch + 1
    o.apply(SetPartition(0, o.lead.version, "a", e, o.lead.isr, o.lead.replicas))  # (a new epoch of a's)
    o.run()
    o.put("a", ["lost"], first=2, token="t2")
    assert o.logs["a"].epoch == e and o.logs["b"].last_epoch == e
    assert o.payloads("b") == [b"m1", b"lost"] and o.payloads("a") == [b"m1"]
    o.crash("a")
    o.unwritten.clear()
    o.restart("a")  # (its log: its former epoch only; the quorum: a leads at e)
    a = o.logs["a"]
    assert a.epoch > e and a.role == LEADING
    o.put("a", ["other"], pid=b"p2", token="t3")
    o.tick(1.1)
    assert [r.body for r in o.disk["a"]] == [r.body for r in o.disk["b"]]
    assert o.payloads("b") == [b"m1", b"other"]


def test_a_new_leader_from_the_isr_holds_every_committed_record_and_one_outside_would_not() -> None:
    """The controller elects from the ISR only (cluster/controller.py ``decide_one``); told another
    leadership (an unclean election), a log leads and its followers cut what it lacks: the committed
    records are lost. That is the danger the rule prevents."""
    for clean in (True, False):
        o = Owners("abc")
        o.down.add("c")
        o.elect("a", "ab", replicas="abc")
        for i in range(1, 4):
            o.put("a", [f"m{i}"], first=i, token=i)
        assert o.committed["a"] == [1, 2, 3]
        o.crash("a")
        o.down.discard("c")
        choice = decide_one(0, o.lead, o.lead.replicas, frozenset("bc"))
        assert choice is not None and (choice.leader, choice.isr) == ("b", ("a", "b"))  # (the controller's)
        unclean = SetPartition(0, o.lead.version, "c", o.lead.epoch + 1, ("c",), o.lead.replicas)
        assert not o.meta.allows(unclean)  # (the quorum's rules refuse it whoever proposes it)
        o.elect(*(("b", "b") if clean else ("c", "c")))  # (c, outside the ISR: an unclean election, forced)
        o.tick(1.1)
        assert o.payloads("b") == ([b"m1", b"m2", b"m3"] if clean else [])


# ---------------------------------------------------------------- divergent logs


def _records(o: Owners, member: str) -> list[tuple[int, list[Any]]]:
    return [(r.offset, msgpack.unpackb(r.body, raw=False)) for r in o.disk[member]]


def test_a_follower_whose_last_epoch_the_leader_never_had_cuts_all_of_it() -> None:
    """Simulator seed 9, under the quorum: b led an epoch (its EPOCH record at 2) that a never saw
    and that ended, on a's log, where a's next one began: a fetch from b's end found no divergence
    by offsets alone, and b's record there was kept."""
    o = Owners("ab")
    o.elect("a", "ab")
    o.put("a", ["m1"], first=1, token=1)
    o.down.add("b")
    o.put("a", ["m2"], first=2)  # (on a's disk only, at 2)
    o.pause("a")
    o.down.discard("b")
    o.elect("b")  # (b leads: its EPOCH at 2, where a has m2)
    o.pause("b")
    o.elect("a")  # (a leads again, above b: its EPOCH at 3)
    o.resume("a")
    o.resume("b")
    o.tick(1.1)
    assert o.disk["a"][2].offset == 2 and o.logs["a"].epochs[-1] == (o.lead.epoch, 3)
    assert [r.body for r in o.disk["b"]] == [r.body for r in o.disk["a"]]
    assert o.payloads("b") == [b"m1", b"m2"]


def test_a_fetcher_whose_last_epoch_is_older_than_the_leaders_first_begins_again_at_its_start() -> None:
    """Second review: b's log, after retention and a restart, no longer says where a's epoch ended
    (b's offset 4 was retained away): cut to b's first epoch, a would keep its own never-committed
    x4 at offset 4, below the commit."""
    o = Owners("abc")
    o.down.add("c")
    o.elect("a", "ab", replicas="abc")
    o.put("a", ["m1", "m2", "m3"], first=1, token="a1")
    o.crash("b")
    o.put("a", ["x4", "x5", "x6"], first=4, token="ax")  # (only on a's disk: never committed)
    o.crash("a")
    o.restart("b")
    o.down.discard("c")
    o.elect("b", "b")
    o.tick(1.1)  # (c joins)
    o.put("b", ["y4", "y5", "y6", "y7"], first=4, token="by")
    assert "by" in o.committed["b"] and "ax" not in o.committed["a"]
    o.retain("b", 5)
    o.crash("b")
    o.restart("b")  # (b leads again, at a new epoch: Reelect)
    o.restart("a")
    o.tick(1.1)
    a = o.logs["a"]
    assert a.role == FOLLOWING and a.start == 5 and a.commit == o.logs["b"].commit
    assert _records(o, "a") == _records(o, "b")
    assert all(b[5] != b"x4" for _, b in _records(o, "a") if b[1] == 0)


def test_a_returning_follower_cuts_its_divergent_tail_before_it_takes_the_leaders_commit() -> None:
    """Second review: a took b's commit, past its own 150 never-committed records, before cutting
    them; they folded into its base and the cut then needed a reload that never came."""
    o = Owners("abc", cache_records=100, max_uncommitted=10_000)
    o.elect("a", "abc")
    o.put("a", ["m1"], first=1, token="a1")
    o.down.update("bc")
    o.put("a", [f"x{i}" for i in range(2, 152)], first=2, token="ax")
    o.crash("a")
    o.down -= {"b", "c"}
    o.elect("b", "bc")
    o.put("b", [f"y{i}" for i in range(2, 302)], first=2, token="by")
    o.restart("a")
    o.tick(1.1)
    assert o.put("b", ["z"], first=302, token="bz") == 0
    o.tick(1.1)
    assert "bz" in o.committed["b"] and o.reloads == 0
    assert _records(o, "a") == _records(o, "b")


def _restart_behind_a_later_branch(o: Owners) -> None:
    """a (b down) writes 30 cursor records that are never committed; b, restarted, leads a later
    branch with c; a restarts holding them (with small caches, most of them not in memory), cut off
    from the quorum (told nothing yet)."""
    o.down.add("c")
    o.elect("a", "ab", replicas="abc")
    o.put("a", ["m1"], first=1, token="a1")
    o.commit_cursor("a", b"c1", "s", 1)
    o.crash("b")
    for i in range(30):
        o.commit_cursor("a", b"c%d" % i, "s", 2)
    o.crash("a")
    o.restart("b")
    o.down.discard("c")
    o.elect("b", "b")
    o.tick(1.1)  # (c joins)
    o.put("b", ["y2"], first=2, token="by")
    assert "by" in o.committed["b"]
    o.deaf.add("a")
    o.restart("a")


def test_a_cut_below_the_records_held_in_memory_reads_the_log_again() -> None:
    """a restarts with 30 never-committed cursor records (cursors are outside the room check) and
    keeps only 10 in memory; following b's branch it must cut below them: the shell reads the log
    again (``Reload``), and a's cursors and producers are those of b's log."""
    o = Owners("abc", cache_records=10, max_uncommitted=10)
    _restart_behind_a_later_branch(o)
    assert o.logs["a"].base_at > o.logs["a"].commit
    o.resume("a")
    o.tick(1.1)
    a, b = o.logs["a"], o.logs["b"]
    assert o.reloads == 1 and not a.reloading and a.role == FOLLOWING
    assert _records(o, "a") == _records(o, "b")
    assert a.state.cursors == b.state.cursors == {(b"c1", "s"): 1}
    assert a.state.producers == b.state.producers


def _diverged(o: Owners) -> tuple[PartitionLog, PartitionLog]:
    """a (30 never-committed cursor records, 10 in memory) told to follow b; its FETCH is lost."""
    _restart_behind_a_later_branch(o)
    a, b = o.logs["a"], o.logs["b"]
    o.told["a"] = o.lead.version
    assert [type(x) for x in a.lead(o.lead, o.now)] == [PeerFrame] and a.role == FOLLOWING
    return a, b


def test_an_answer_to_a_resent_fetch_is_not_taken_twice() -> None:
    """Third review: a fetch resent after fetch_retry can be answered twice. The second "cut to 3",
    taken while the first one's Reload was under way, cut all of a's epoch (a reset), and the
    Reload then put back a log the disk no longer had; taken after a plain cut, it cut records the
    leader had committed."""
    o = Owners("abc", cache_records=10, max_uncommitted=10)
    a, b = _diverged(o)
    (d,) = [x for x in b.on_fetch("a", b.epoch, a.end, a.last_epoch, o.now) if isinstance(x, PeerFrame)]
    f = d.frame
    first = a.on_data("b", f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], [], f[11], o.now)
    assert first == [Reload(0, 3)] and a.reloading
    assert a.on_data("b", f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], [], f[11], o.now) == []
    assert a.retain_limit() == a.start  # (the cursors are not known until the log is read again)
    o.deaf.discard("a")
    o.feed("a", first)
    o.run()
    assert not a.reloading and a.end == o.disk["a"][-1].offset + 1 and o.reloads == 1
    assert a.on_data("b", f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], [], f[11], o.now) == []  # (after it)
    o.tick(1.1)
    assert _records(o, "a") == _records(o, "b")


def test_a_member_that_leads_while_its_reload_is_under_way_keeps_what_it_wrote_since() -> None:
    """Its EPOCH goes to disk after the Reload: ``reloaded`` takes it again over what was read."""
    o = Owners("abc", cache_records=10, max_uncommitted=10)
    a, b = _diverged(o)
    (d,) = [x for x in b.on_fetch("a", b.epoch, a.end, a.last_epoch, o.now) if isinstance(x, PeerFrame)]
    f = d.frame
    reload = a.on_data("b", f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], [], f[11], o.now)
    assert reload == [Reload(0, 3)]
    o.apply(SetPartition(0, o.lead.version, "a", o.lead.epoch + 1, ("a",), ("a",)))  # (the only replica now)
    o.told["a"] = o.lead.version
    epoch = a.lead(o.lead, o.now)
    assert a.role == LEADING and a.reloading and [x.records[0].offset for x in epoch if isinstance(x, Append)] == [3]
    assert a.put([["t", None, None, b"z"]], b"p9", 1, 1, lambda s: s, 5000)[0] == 2  # (busy: state unknown)
    o.deaf.discard("a")
    o.feed("a", reload + epoch)
    o.run()
    assert not a.reloading and a.end == 4 and [r.offset for r in o.disk["a"]] == [0, 1, 2, 3]
    assert a.state.cursors == {(b"c1", "s"): 1} and a.last_epoch == a.epoch
    assert o.put("a", ["z"], first=1, pid=b"p9", token="az") == 0 and "az" in o.committed["a"]


def test_a_follower_takes_no_records_from_a_leader_below_the_epoch_it_follows() -> None:
    """Simulator seed 5136, under the quorum: b's fetch waited at a (nothing new); b then led (an
    EPOCH at 2); following a again, at a's new epoch, it must not take a's answer to that old
    fetch (a's records of its old epoch, after b's EPOCH: a spliced log)."""
    o = Owners("abc")
    o.elect("a", "abc")
    o.put("a", ["m1"], first=1, token="a1")
    a, b = o.logs["a"], o.logs["b"]
    assert "b" in a.parked  # (b's next fetch waits at a)
    o.pause("a")
    o.elect("b", "bc")
    assert b.role == LEADING and b.epoch > a.epoch and o.disk["b"][-1].offset == 2
    o.deaf.add("a")
    o.down.discard("a")  # (a goes on at its old epoch, not told)
    o.elect("a", "abc")  # (b follows a at a's new epoch, which a does not know yet)
    st, actions = a.put([["t", None, None, b"x2"], ["t", None, None, b"x3"]], b"p2", 1, 1, lambda s: s, 6000)
    assert st == 0
    o.feed("a", actions)  # (a's answer to b's old fetch: records 2 and 3 of a's old epoch)
    o.run()
    epochs = [msgpack.unpackb(r.body, raw=False)[0] for r in o.disk["b"]]
    assert epochs == sorted(epochs), epochs
    o.resume("a")
    o.tick(1.1)
    assert _records(o, "a") == _records(o, "b")  # (b cut its EPOCH and took a's branch, x2 and x3 too)


def test_a_new_leader_shorter_than_a_follower_has_the_follower_cut_what_was_never_committed() -> None:
    """c took m2 and m3 from a while b (in the ISR) did not: never committed, never acknowledged.
    The quorum makes b leader (from the ISR): c's longer log is cut to b's."""
    o = Owners("abc")
    o.elect("a", "abc")
    o.put("a", ["m1"], first=1, token="t1")
    o.pause("b")
    o.put("a", ["m2", "m3"], first=2, token="t2")
    assert o.payloads("c") == [b"m1", b"m2", b"m3"] and o.committed["a"] == ["t1"]
    o.crash("a")
    o.resume("b")
    o.elect("b", "bc")
    o.tick(1.1)
    assert o.logs["c"].role == FOLLOWING and _records(o, "c") == _records(o, "b")
    assert o.payloads("c") == [b"m1"]
    assert o.put("b", ["m2"], first=2, token="b2") == 0 and o.committed["b"] == ["b2"]


def test_a_replica_of_a_partition_without_a_leader_stands_by() -> None:
    """Simulator seed 207, under the quorum: no in-sync replica is live, the partition has no leader
    (a higher epoch fences the old one); its replicas neither lead nor fetch, and refuse puts."""
    o = Owners("ab")
    o.elect("a", "ab")
    o.elect(None)
    a, b = o.logs["a"], o.logs["b"]
    assert (a.role, b.role) == (IDLE, IDLE) and a.epoch == b.epoch == o.lead.epoch
    assert a.put([["t", None, None, b"x"]], b"p", 1, 1, str, 0)[0] == 1
    assert not [x for x in a.tick(5.0) + b.tick(5.0) if isinstance(x, PeerFrame | Reelect)]


def test_a_follower_joins_the_isr_only_by_a_fetch_that_itself_reached_the_commit() -> None:
    """A follower outside the ISR that fetched up to the commit at this epoch once, and fetches
    now from behind it (its disk lost what it had: fsync = never), is not added on the strength of
    the old fetch."""
    o = Owners("abc", fsync="never")
    o.down.add("c")
    o.elect("a", "ab", replicas="abc")
    a = o.logs["a"]
    o.put("a", ["m1", "m2"], token="t")
    assert o.committed["a"] == ["t"] and a.commit == 3
    o.quorum_open = False
    o.down.discard("c")
    o.tick(1.1)  # (c copies and fetches from 3: a asks to add it)
    assert a.adding == {"c"} and a.followers["c"] == 3
    o.down.add("c")
    o.elect("a", "ab")  # (another change first: the add is refused, c is counted no more)
    assert a.adding == set()
    a.on_fetch("c", a.epoch, 1, a.epoch, o.now)  # (c restarted with only the EPOCH record)
    assert a.adding == set()


def test_a_fetch_read_from_disk_is_not_answered_once_the_epoch_it_was_read_for_is_over() -> None:
    """Its match with the fetcher's log was judged against the log of that epoch, which a leader
    that stepped down (and maybe cut its log, following another) no longer has."""
    o = Owners("abc", cache_records=2, max_uncommitted=2)
    o.down.add("c")
    o.elect("a", "ab", replicas="abc")
    for i in range(1, 9):
        o.put("a", [f"m{i}"], first=i)
    a = o.logs["a"]
    reads = [x for x in a.on_fetch("c", a.epoch, 0, 0, o.now) if isinstance(x, ReadLog)]
    assert len(reads) == 1 and reads[0].start == 0  # (older than the cache: read from disk)
    recs = [r for r in o.disk["a"] if r.offset >= 0][: reads[0].limit]
    o.elect("b")  # (a follows b now)
    assert a.role == FOLLOWING and a.read_done(reads[0].token, recs) == []
    o.elect("a")
    assert a.role == LEADING and a.read_done(reads[0].token, recs) == []  # (a later epoch of a's: no either)
