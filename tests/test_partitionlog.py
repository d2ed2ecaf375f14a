"""The durable partition log core (cluster/partitionlog.py) directly: owners wired by a tiny
in-test network whose disks perform the actions in order; fake time."""

from __future__ import annotations

from collections import deque
from typing import Any

import msgpack
import pytest

from roost.cluster.logrecords import LogScan, message_body
from roost.cluster.partitionlog import (
    CLAIMING,
    CURSOR,
    FOLLOWING,
    LEADING,
    Append,
    Checkpoint,
    Committed,
    LogFormatError,
    LogSettings,
    PartitionLog,
    PeerFrame,
    ReadDone,
    ReadLog,
    Reload,
    ResetLog,
    SaveSeen,
    Truncate,
    decode_untrusted_body,
)
from roost.node.segmentlog import Record


class Owners:
    """Members' partition-0 logs, their disks (lists of records), a FIFO network, and time."""

    def __init__(self, names: str, **settings: Any) -> None:
        self.s = LogSettings(**settings)
        self.logs = {m: PartitionLog(0, m, self.s) for m in names}
        self.disk: dict[str, list[Record]] = {m: [] for m in names}
        self.checkpoint: dict[str, int] = {m: 0 for m in names}  # each disk's commit checkpoint (Checkpoint)
        self.start: dict[str, int] = {m: 0 for m in names}  # where each disk's log begins (ResetLog, retention)
        self.reloads = 0
        self.seen: dict[str, int] = {m: 0 for m in names}  # each disk's saved accepted claim (SaveSeen)
        self.queue: deque[tuple[str, Any]] = deque()
        self.down: set[str] = set()
        self.committed: dict[str, list[Any]] = {m: [] for m in names}
        self.reads: list[ReadDone] = []
        self.now = 0.0

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
            elif isinstance(a, SaveSeen):
                self.seen[member] = max(self.seen[member], a.epoch)
                self.feed(member, log.seen_saved(a.epoch, self.now))
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
        raise AssertionError("no quiescence")

    def deliver(self, sender: str, a: PeerFrame) -> None:
        if a.member in self.down:
            return
        to = self.logs[a.member]
        f = a.frame
        if f[0] == "FETCH":
            self.feed(a.member, to.on_fetch(sender, f[2], f[3], f[4], f[5], self.now))
        else:
            recs = [Record(o, t, b) for o, t, b in f[10]]
            epoch, status, start, end, last_epoch, commit, truncate, reset = f[2:10]
            self.feed(a.member, to.on_data(sender, epoch, status, start, end, last_epoch, commit, truncate, reset,
                                           recs, f[11], self.now))  # fmt: skip

    def assign(self, owners: str, previous: str = "", epoch: int = 1) -> None:
        for m in self.logs:
            if m not in self.down:
                self.feed(m, self.logs[m].assign(list(owners), [p for p in previous if p not in self.down],
                                                 epoch, self.now))  # fmt: skip
        self.run()

    def tick(self, dt: float) -> None:
        self.now += dt
        for m, log in self.logs.items():
            if m not in self.down:
                self.feed(m, log.tick(self.now))
        self.run()

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

    def restart(self, member: str) -> None:
        self.down.discard(member)
        self.logs[member] = PartitionLog(0, member, self.s)
        self.logs[member].recovered(self.scan(member))

    def scan(self, member: str) -> LogScan:
        disk = self.disk[member]
        return LogScan.of(disk[0].offset if disk else self.start[member], list(disk), self.s.keep,
                          self.checkpoint[member], self.seen[member])  # fmt: skip

    def retain(self, member: str, start: int) -> None:
        """Retention deleted every record before ``start`` from ``member``'s disk."""
        self.logs[member].retained(start)
        self.disk[member] = [r for r in self.disk[member] if r.offset >= start]
        self.start[member] = start


def test_a_put_is_committed_only_once_the_follower_has_it_on_disk() -> None:
    o = Owners("ab")
    o.assign("ab")
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


def test_a_single_owner_commits_on_its_own_disk() -> None:
    o = Owners("a")
    o.assign("a")
    assert o.put("a", ["x", "y"], token="t") == 0
    assert o.committed["a"] == ["t"]


def test_a_retried_put_is_stored_once_and_acknowledged_again() -> None:
    o = Owners("ab")
    o.assign("ab")
    o.put("a", ["m1", "m2"], first=1, token="first")
    o.put("a", ["m1", "m2", "m3"], first=1, token="retry")
    assert o.payloads("a") == [b"m1", b"m2", b"m3"]
    assert o.committed["a"] == ["first", "retry"]
    assert o.put("a", ["m2"], first=2, token="dup") == 0  # all old: acknowledged, nothing written
    assert o.committed["a"][-1] == "dup"
    assert o.payloads("b") == [b"m1", b"m2", b"m3"]


def test_a_gap_is_refused_and_not_a_follower_is_refused() -> None:
    o = Owners("ab")
    o.assign("ab")
    o.put("a", ["m1"], first=1)
    assert o.put("a", ["m5"], first=5) == 3
    assert o.put("b", ["m2"], first=2) == 1
    assert o.payloads("a") == [b"m1"]


def test_uncommitted_puts_are_bounded() -> None:
    o = Owners("ab", max_uncommitted=3)
    o.assign("ab")
    o.crash("b")
    assert o.put("a", ["1", "2"], first=1) == 0
    assert o.put("a", ["3", "4"], first=3) == 0  # (room for one more: "3" is taken)
    assert o.put("a", ["4"], first=4) == 2  # (3 uncommitted: busy)
    assert o.payloads("a") == [b"1", b"2", b"3"]


def test_a_put_larger_than_the_room_left_is_taken_in_part_and_acknowledged_as_far_as_taken() -> None:
    o = Owners("ab", max_uncommitted=4)
    o.assign("ab")
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


def test_failover_keeps_every_committed_record_and_the_new_follower_copies_them() -> None:
    o = Owners("abc")
    o.assign("ab")
    for i in range(1, 6):
        o.put("a", [f"m{i}"], first=i, token=i)
    assert o.committed["a"] == [1, 2, 3, 4, 5]
    o.crash("a")
    o.assign("bc", previous="ab", epoch=2)
    assert o.logs["b"].role == LEADING and o.logs["b"].epoch > o.logs["a"].epoch
    assert o.payloads("c") == [b"m1", b"m2", b"m3", b"m4", b"m5"]
    o.put("b", ["m6"], first=6, token=6)
    assert o.committed["b"] == [6]
    assert o.payloads("c")[-1] == b"m6"


def test_a_returning_leader_with_an_uncommitted_tail_truncates_it_and_follows() -> None:
    o = Owners("ab")
    o.assign("ab")
    o.put("a", ["m1"], first=1, token=1)
    o.crash("b")
    o.put("a", ["lost2", "lost3"], first=2, token=2)  # never committed, never acknowledged
    assert o.committed["a"] == [1]
    o.crash("a")
    o.down.discard("b")
    o.assign("b", epoch=2)
    o.put("b", ["m2"], first=2, token="b2")
    assert o.committed["b"] == ["b2"]
    o.restart("a")
    o.assign("ba", epoch=3)
    assert o.logs["a"].role == FOLLOWING
    assert o.payloads("a") == [b"m1", b"m2"]  # the uncommitted tail is cut, b's records copied
    assert o.payloads("b") == [b"m1", b"m2"]
    a = o.logs["a"]
    assert a.state.producers[b"p1"][0] == 2  # producer state rebuilt after the cut


def test_a_returning_primary_claims_copies_what_it_missed_then_leads() -> None:
    o = Owners("ab")
    o.assign("ab")
    o.put("a", ["m1"], first=1, token=1)
    o.crash("a")
    o.assign("b", epoch=2)
    o.put("b", ["m2", "m3"], first=2, token="b")
    o.restart("a")
    o.assign("ab", epoch=3)  # a is primary again by the preference list
    assert (o.logs["a"].role, o.logs["b"].role) == (LEADING, FOLLOWING)
    assert o.payloads("a") == [b"m1", b"m2", b"m3"]
    assert o.put("a", ["m3", "m4"], first=3, token="a") == 0  # m3 is a duplicate already stored
    assert o.payloads("b") == [b"m1", b"m2", b"m3", b"m4"]
    assert o.committed["a"][-1:] == ["a"]


def test_a_claim_fences_the_old_leader_whose_pending_puts_are_never_acknowledged() -> None:
    o = Owners("ab")
    o.assign("ab")
    o.down.add("b")
    o.put("a", ["pending"], first=1, token="never")
    o.down.discard("b")
    # b thinks a is dead and claims; a hears the claim and steps down
    o.feed("b", o.logs["b"].assign(["b"], ["a"], 2, o.now))
    o.run()
    assert o.logs["a"].role not in (LEADING, CLAIMING)
    assert o.logs["b"].role == LEADING
    assert "never" not in o.committed["a"]
    assert o.payloads("b") == [b"pending"]  # copied from a's longer log (a took the claim)


def test_a_follower_behind_the_leaders_retention_resets() -> None:
    o = Owners("ab")
    o.assign("a")
    for i in range(1, 4):
        o.put("a", [f"m{i}"], first=i)
    a = o.logs["a"]
    a.start = a.base_at = 3  # (as if retention deleted offsets 0..2)
    o.assign("ab", epoch=2)
    assert o.disk["b"][0].offset == 3
    assert o.logs["b"].end == a.end


def test_a_follower_far_behind_the_cache_is_served_from_disk() -> None:
    o = Owners("ab", cache_records=2, max_uncommitted=2)
    o.assign("a")
    for i in range(1, 9):
        o.put("a", [f"m{i}"], first=i)
    assert o.logs["a"].base_at > 0  # folded out of the cache
    o.assign("ab", epoch=2)
    assert o.payloads("b") == [f"m{i}".encode() for i in range(1, 9)]


def test_recovery_rebuilds_epochs_producers_and_cursors() -> None:
    o = Owners("a")
    o.assign("a")
    o.put("a", ["x", "y"], first=1)
    st, acts = o.logs["a"].commit_cursor(b"c1", "d", 2, "cur", 5000)
    o.feed("a", acts)
    o.run()
    assert st == 0 and o.committed["a"][-1] == "cur"
    st, acts = o.logs["a"].commit_cursor(b"c1", "d", 1, "back", 5000)  # never backwards
    o.feed("a", acts)
    o.run()
    assert o.logs["a"].state.cursors[(b"c1", "d")] == 2
    o.restart("a")
    a = o.logs["a"]
    assert a.state.producers[b"p1"][0] == 2
    assert a.state.cursors[(b"c1", "d")] == 2
    assert a.epochs == [(a.epochs[0][0], 0)]
    assert a.seen == a.epochs[0][0]  # (a claim below the epoch its log holds is refused after a restart)
    assert len([r for r in o.disk["a"] if msgpack.unpackb(r.body)[1] == CURSOR]) == 1


def test_a_fetch_answer_with_a_bad_record_body_takes_none_of_its_records() -> None:
    o = Owners("ab")
    o.assign("ab")
    b = o.logs["b"]
    end = b.end
    good = Record(end, 1, msgpack.packb([1, 0, "t", None, None, b"x", b"P" * 16, 1]))
    bad = Record(end + 1, 1, b"\xc1")
    with pytest.raises(LogFormatError):
        b.on_data("a", b.epoch, 0, 0, end + 2, b.last_epoch, end, -1, -1, [good, bad], end, o.now)
    assert (b.end, b.appending) == (end, 0)  # (nothing taken: the next fetch asks from the same end)


def test_recovery_in_chunks_keeps_the_state_of_every_record_and_only_the_newest_in_memory() -> None:
    o = Owners("a", cache_records=100, max_uncommitted=10)
    o.assign("a")
    for i in range(1, 301):
        o.put("a", [f"m{i}"], first=i)
    o.commit_cursor("a", b"c1", "d", 5)
    whole = LogScan.of(0, o.disk["a"])
    chunked = LogScan(0, o.s.keep)
    for i in range(0, len(o.disk["a"]), 7):
        chunked.feed(o.disk["a"][i : i + 7])
    assert (chunked.state, chunked.epochs, chunked.end) == (whole.state, whole.epochs, whole.end)
    assert len(chunked.tail) == 100 and chunked.base_at == chunked.end - 100
    o.restart("a")
    a = o.logs["a"]
    # (the commit checkpoint: the commit when the last record, the cursor, was appended)
    assert (a.state.producers[b"p1"][0], a.state.cursors[(b"c1", "d")], a.commit) == (300, 5, a.end - 1)
    assert a.read_committed(0, 5, "t")[0] is None  # (older than the cache: read from disk)


def test_retention_never_takes_uncommitted_records_or_a_cursors_only_record() -> None:
    o = Owners("ab")
    o.assign("ab")
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
    o.assign("a")  # (EPOCH at offset 0, time 0)
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


def test_a_paused_leader_whose_follower_comes_back_with_a_higher_epoch_claims_again() -> None:
    """Found by a chaos run (SIGSTOP of a primary for 3.4 s): while a was paused, b claimed and
    led; a resumed still leading at its old epoch with a map that never changed, b's map named a
    primary again and b fetched from it at b's higher epoch. a stepped down and, its map naming it
    primary still, never claimed again: the partition had no leader until the next map change."""
    o = Owners("abc")
    o.assign("ab")
    o.put("a", ["m1"], first=1, token=1)
    o.down.add("a")  # paused: hears nothing, says nothing, keeps its state
    o.feed("b", o.logs["b"].assign(["b", "c"], [], 2, o.now))  # (a is not live in b's map: not probed)
    o.feed("c", o.logs["c"].assign(["b", "c"], [], 2, o.now))
    o.run()
    assert o.logs["b"].role == LEADING
    o.put("b", ["m2"], first=2, token="b2")
    assert o.committed["b"] == ["b2"]
    o.down.discard("a")  # resumed: a's map is the one it had (a primary); b's names a again
    assert o.logs["a"].role == LEADING
    o.feed("b", o.logs["b"].assign(["a", "b"], ["c"], 3, o.now))
    o.feed("c", o.logs["c"].assign(["a", "b"], ["c"], 3, o.now))
    o.run()
    o.tick(2.0)  # (retries, if any)
    a, b = o.logs["a"], o.logs["b"]
    assert (a.role, b.role) == (LEADING, FOLLOWING)
    assert a.epoch > 2 and b.epoch == a.epoch
    assert o.payloads("a") == [b"m1", b"m2"]  # a copied what b committed meanwhile
    assert o.put("a", ["m3"], first=3, token="a3") == 0
    assert o.committed["a"][-1] == "a3" and o.payloads("b") == [b"m1", b"m2", b"m3"]


@pytest.mark.parametrize("alone", [False, True])
def test_a_member_cut_off_alone_does_not_lead_a_replicated_partition_so_its_stale_log_never_wins(alone: bool) -> None:
    """Found by a chaos run (1,770 committed records cut from both owners): c, not an owner, was
    cut off from everyone, saw itself the only live member and claimed the partition with nobody
    to ask; the EPOCH record it wrote gave its stale log the highest last epoch. When c later
    followed the primary at that epoch, the primary claimed again, took c's log as the best and cut
    its own committed records to match it. A replicated partition's log now leads only after
    hearing from another member (``alone``: a cluster of one member, or one replica, may lead
    alone); ``alone=True`` shows the loss it prevents."""
    o = Owners("abc")
    o.assign("ab")
    o.put("a", ["m1"], first=1, token=1)
    o.down.add("a")  # a paused: b claims with c and leads; m2 on b and c
    for m in "bc":
        o.feed(m, o.logs[m].assign(["b", "c"], [], 2, o.now))
    o.run()
    o.put("b", ["m2"], first=2, token=2)
    o.down.discard("a")  # a resumes; the map is a, b again: c is no owner now
    for m in "bc":
        o.feed(m, o.logs[m].assign(["a", "b"], ["c"], 3, o.now))
    o.run()
    o.tick(2.0)
    assert o.put("a", ["m3", "m4"], first=3, token=3) == 0
    assert o.committed["a"][-1] == 3 and o.payloads("b") == [b"m1", b"m2", b"m3", b"m4"]
    o.down.update("ab")  # c cut off: the only live member in its own map
    o.feed("c", o.logs["c"].assign(["c"], [], 4, o.now, alone=alone))
    o.run()
    assert (o.logs["c"].role == LEADING) is alone
    o.down.clear()  # healed, then b paused: c follows a, at c's epoch
    o.feed("c", o.logs["c"].assign(["a", "b"], [], 5, o.now))
    o.run()
    o.down.add("b")
    for m in "ac":
        o.feed(m, o.logs[m].assign(["a", "c"], [], 6, o.now))
    o.run()
    o.tick(2.0)
    assert o.logs["a"].role == LEADING
    committed = [b"m1", b"m2", b"m3", b"m4"]
    if alone:
        assert o.payloads("a") == [b"m1", b"m2"]  # (the loss: a took c's stale log as the best)
    else:
        assert o.payloads("a") == committed and o.payloads("c") == committed


@pytest.mark.parametrize("alone", [False, True])
def test_a_leader_left_alone_in_its_map_commits_nothing_so_no_acknowledged_put_is_cut(alone: bool) -> None:
    """Found by a chaos run (dur.f, seed 7): the primary, cut off from every member, kept leading
    with nobody to follow it; for the half second between the heal and its map seeing the others
    again, clients reached it and it committed and acknowledged their puts on its own disk alone.
    Meanwhile its secondary had claimed with the third member, so when the primary claimed again
    it took that log as the best and cut those acknowledged puts. A replicated log's leader now
    commits nothing while its map leaves it no follower (``alone=True`` shows the loss)."""
    o = Owners("abc")
    o.assign("ab")
    o.put("a", ["m1"], first=1, token=1)
    o.down.update("bc")  # a cut off: its map has only a (b and c hear nothing from it)
    o.feed("a", o.logs["a"].assign(["a"], [], 2, o.now, alone=alone))
    o.run()
    o.down.clear()
    o.down.add("a")  # (b and c, apart from a: b claims with c and leads)
    for m in "bc":
        o.feed(m, o.logs[m].assign(["b", "c"], [], 2, o.now))
    o.run()
    o.put("b", ["m2"], pid=b"p2", first=1, token="b2")  # (another producer, at b)
    assert o.committed["b"] == ["b2"]
    o.down.clear()  # healed; a's map still shows it alone for a moment, and a client reaches it
    assert o.put("a", ["x2"], first=2, token="a-alone") == 0
    assert ("a-alone" in o.committed["a"]) is alone  # acknowledged with no other copy?
    for m in "abc":  # the maps agree again: a primary, b secondary
        o.feed(m, o.logs[m].assign(["a", "b"], ["c"], 3, o.now))
    o.run()
    o.tick(2.0)
    assert o.logs["a"].role == LEADING and o.payloads("a") == [b"m1", b"m2"]  # (x2 cut: b's log was the best)
    if not alone:  # every acknowledged put is still there
        assert o.put("a", ["x2"], first=2, token="again") == 0 and o.committed["a"][-1] == "again"
        assert o.payloads("a") == o.payloads("b") == [b"m1", b"m2", b"x2"]


def test_a_leader_serves_readers_only_while_its_followers_fetch_from_it() -> None:
    """Found by a chaos run (dur.b, seed 7): the primary was cut off while its secondary claimed
    with the third member and a reader committed its cursor there; after the heal the old primary
    still led at its old epoch, with its old cursors, and a reader that asked it before its
    follower's next fetch (which makes it claim again) was given records from the stale cursor.
    A leader now serves readers only while every follower in its map fetched from it within
    fetch_wait + fetch_retry (a lease its follower stops renewing once it follows another)."""
    o = Owners("abc")
    o.assign("ab")
    o.put("a", ["m1", "m2", "m3"], first=1)
    assert o.logs["a"].readable(o.now)
    o.down.add("a")  # paused: b claims with c; a reader commits its cursor there
    for m in "bc":
        o.feed(m, o.logs[m].assign(["b", "c"], [], 2, o.now))
    o.run()
    st, acts = o.logs["b"].commit_cursor(b"c1", "d", 4, "cur", 5000)
    o.feed("b", acts)
    o.run()
    assert st == 0 and o.committed["b"] == ["cur"]
    o.now += 3.0  # a resumes 3 s later, still leading at its old epoch, without that cursor
    o.down.discard("a")
    a = o.logs["a"]
    assert a.role == LEADING and (b"c1", "d") not in a.state.cursors
    assert not a.readable(o.now)  # b has not fetched from it since: no reader is served
    for m in "bc":  # the map names a again: b follows it at b's epoch, and a claims above it
        o.feed(m, o.logs[m].assign(["a", "b"], ["c"], 3, o.now))
    o.run()
    assert a.role == LEADING and a.state.cursors[(b"c1", "d")] == 4 and not a.readable(o.now)
    o.tick(1.5)  # b's next fetch, at a's new epoch: readers are served
    assert a.readable(o.now)
    o.tick(1.0)  # (b keeps fetching: the lease holds)
    assert a.readable(o.now)


def test_fetches_read_in_the_burst_after_a_pause_do_not_renew_the_read_lease() -> None:
    """Found by a chaos run (dur.f, seed 11): the follower's fetches sent just before the primary
    was paused waited in its socket and were read in a burst when it resumed, renewing the lease
    of a leader the follower had left meanwhile; a restarted reader was given records from a stale
    cursor. A log told of a local pause (the member notices it: ``local_pause``) takes no lease
    from fetches read within fetch_retry after it. And a replicated log's leader with no follower
    in its map serves no reader either."""
    o = Owners("ab")
    o.assign("ab")
    o.put("a", ["m1"], first=1)
    a = o.logs["a"]
    o.tick(0.6)
    assert a.readable(o.now)
    epoch, end, last_epoch = a.epoch, a.end, a.last_epoch  # (a fetch b sent before a stood still)
    o.now += 4.0  # a resumes 4 s later and notices it
    a.paused(o.now)
    o.feed("a", a.on_fetch("b", epoch, end, last_epoch, False, o.now))  # read from the socket in the burst
    o.run()
    assert not a.readable(o.now)
    o.tick(1.5)  # b's fetches since then are fresh
    assert a.readable(o.now)
    o.feed("a", a.assign(["a"], [], 2, o.now, alone=False))  # b gone from a's map: nobody left
    o.run()
    assert not a.readable(o.now)
    single = Owners("a")
    single.assign("a")
    assert single.logs["a"].readable(single.now)  # (one replica: it reads alone)


# ---------------------------------------------------------------- found by the simulator's durable workload


def test_a_primary_below_an_owner_that_follows_at_a_higher_epoch_claims_above_it() -> None:
    """Simulator seed 8: b claimed (its map said a was gone) while a was cut off, then the maps agreed
    on a again. a, still leading below b's epoch, stepped down and stayed idle: no leader for ever."""
    o = Owners("ab")
    o.assign("ab")
    o.put("a", ["m1"], first=1, token=1)
    o.down.add("a")
    o.feed("b", o.logs["b"].assign(["b"], ["a"], 5, o.now))  # (its claim never reaches a)
    o.run()
    claimed = o.logs["b"].seen
    o.down.discard("a")
    o.feed("b", o.logs["b"].assign(["a", "b"], [], 6, o.now))  # (a's map never changed: a still leads)
    o.run()
    a = o.logs["a"]
    assert a.role == LEADING and a.epoch > claimed and o.logs["b"].role == FOLLOWING
    assert o.put("a", ["m2"], first=2, token=2) == 0
    o.tick(2.0)  # (b's next fetch)
    assert o.committed["a"][-1] == 2
    assert o.payloads("b") == [b"m1", b"m2"]


def test_a_leader_wakes_a_follower_that_never_fetched() -> None:
    """Simulator seed 8: a member that joined became a partition's secondary, but its log was not
    active (no put, claim or fetch had reached it), so it never fetched and nothing committed."""
    o = Owners("ab")
    o.assign("a")
    o.feed("a", o.logs["a"].assign(["a", "b"], [], 2, o.now))  # (b is not told: its log is not active)
    o.run()
    a = o.logs["a"]
    assert a.next_deadline() <= o.now + a.s.fetch_retry  # (it wakes for that)
    frames = [x for x in a.tick(o.now + a.s.fetch_retry) if isinstance(x, PeerFrame)]
    assert [(f.member, f.frame[0]) for f in frames] == [("b", "FETCH")]  # (it makes b's log active)
    o.feed("b", o.logs["b"].assign(["a", "b"], [], 2, o.now))
    o.run()
    assert a.followers["b"] >= 0  # (b fetches: not woken again while it does)
    assert not [x for x in a.tick(o.now + a.s.fetch_retry / 2) if isinstance(x, PeerFrame) and x.frame[0] == "FETCH"]


def test_a_producer_acknowledged_past_what_a_log_holds_is_taken_from_its_floor() -> None:
    """Simulator seed 6: after a branch that held a producer's acknowledged puts was cut (both owners
    lost: not promised), every new put of it was refused as a gap, for ever."""
    o = Owners("a")
    o.assign("a")
    o.put("a", ["m1"], first=1)
    status, actions = o.logs["a"].put([["t", None, None, b"m9"]], b"p1", 9, 9, lambda last: "t9", 5000)
    o.feed("a", actions)
    o.run()
    assert status == 0 and o.payloads("a") == [b"m1", b"m9"] and o.committed["a"][-1] == "t9"
    status, _ = o.logs["a"].put([["t", None, None, b"m11"]], b"p1", 11, 10, lambda last: "t11", 5000)
    assert status == 3  # (a gap is a gap)


def test_a_follower_whose_last_epoch_the_leader_never_had_cuts_all_of_it() -> None:
    """Simulator seed 9: both owners came back alone and each led; the follower's epoch was not in
    the leader's log and ended where the leader's next one began, so its record there was kept."""
    o = Owners("ab")
    o.assign("ab")
    o.put("a", ["m1"], first=1, token=1)
    o.crash("b")
    o.put("a", ["m2"], first=2)  # (on a's disk only)
    o.crash("a")
    o.restart("b")
    o.feed("b", o.logs["b"].assign(["b"], [], 1, o.now))  # b leads alone: its EPOCH where a has m2
    o.run()
    o.restart("a")
    o.feed("a", o.logs["a"].assign(["a"], [], 1 << 22, o.now))  # a leads alone, at a higher epoch
    o.run()
    assert o.disk["a"][2].offset == o.disk["b"][2].offset == 2 and o.disk["a"][2].body != o.disk["b"][2].body
    o.assign("ab", epoch=(1 << 22) + 1)
    assert [r.body for r in o.disk["b"]] == [r.body for r in o.disk["a"]]
    assert o.payloads("b") == [b"m1", b"m2"]


def test_two_members_never_lead_one_epoch() -> None:
    """Simulator seed 32: two members claimed alone from the same state and chose the same epoch; a
    follower's epoch check could not tell their records apart."""
    for at in (1, 7, 1 << 20, (5 << 20) + 3):
        epochs = set()
        for m in ("m0", "m1", "m2", "m3", "j0", "j1"):
            log = PartitionLog(0, m, LogSettings())
            log.assign([m], [], at, 0.0)
            assert log.role == LEADING and log.epoch >= at
            epochs.add(log.epoch)
        assert len(epochs) == 6


def test_a_follower_that_took_a_higher_claim_is_not_counted_by_a_leader_below_it() -> None:
    """Simulator seed 72: b took c's claim, then followed a again at a's lower epoch; a committed
    with it, and c's branch, which b had promised to, later cut what a acknowledged."""
    o = Owners("abc")
    o.assign("ab")
    o.put("a", ["m1"], first=1, token=1)
    o.down.add("a")
    o.feed("c", o.logs["c"].assign(["c", "b"], ["a"], 9, o.now))  # (c claims; b takes it, a hears nothing)
    o.run()
    o.down.discard("a")
    o.crash("c")
    o.put("a", ["x"], first=2, token="x")  # b does not follow a: not committed
    o.feed("b", o.logs["b"].assign(["a", "b"], [], 10, o.now))
    o.run()
    assert "x" not in o.committed["a"]  # (a's puts from below c's claim are never acknowledged)
    assert o.logs["a"].role == LEADING and o.logs["a"].epoch > o.logs["c"].epoch
    assert o.put("a", ["x", "y"], first=2, token="y") == 0
    o.tick(2.0)  # (b's next fetch)
    assert o.committed["a"][-1] == "y" and o.payloads("b") == [b"m1", b"x", b"y"]


def test_a_claim_copies_only_from_logs_below_its_epoch() -> None:
    """Simulator seed 79: an owner restarted with its log but had seen no epoch; a claim below its
    records' epoch took them and led below them (epochs out of order in the log)."""
    o = Owners("abc")
    o.assign("ab", epoch=1 << 22)
    o.put("a", ["m1"], first=1, token=1)
    o.crash("a")
    o.crash("b")
    o.restart("b")
    assert o.logs["b"].seen >= o.logs["b"].last_epoch > 0
    o.feed("c", o.logs["c"].assign(["c", "b"], [], 1, o.now))
    o.run()
    c = o.logs["c"]
    assert c.role == LEADING and c.epoch > o.logs["b"].last_epoch and o.payloads("c") == [b"m1"]
    assert [e for e, _ in c.epochs] == sorted(e for e, _ in c.epochs)


def test_an_owner_of_a_partition_without_live_owners_stands_by() -> None:
    """Simulator seed 207: a map with no live owner for a partition (a member whose leave is
    committed, alone) raised IndexError in the member core."""
    o = Owners("ab")
    o.assign("ab")
    assert o.logs["b"].assign([], [], 3, o.now) == [] and o.logs["b"].role != LEADING


def test_a_follower_that_copied_a_leaders_records_refuses_a_claim_below_them() -> None:
    """Simulator seed 842: b followed a leader that had claimed without asking it, so b took no claim
    and had seen no epoch; a claim below a's records was taken, copied them, and led below them."""
    o = Owners("abc")
    o.feed("a", o.logs["a"].assign(["a"], [], 1 << 22, o.now))  # (a leads alone: b is not asked)
    o.run()
    o.put("a", ["m1"], first=1, token=1)
    o.assign("ab", epoch=(1 << 22) + 1)
    assert o.payloads("b") == [b"m1"] and o.logs["b"].seen >= o.logs["a"].epoch
    o.crash("a")
    o.feed("c", o.logs["c"].assign(["c", "b"], [], 1, o.now))
    o.run()
    c = o.logs["c"]
    assert c.role == LEADING and c.epoch > o.logs["a"].epoch and o.payloads("c") == [b"m1"]


def test_an_answer_to_a_claim_that_comes_after_the_claim_ended_is_not_a_leaders() -> None:
    """Simulator seed 1716: a's claim was answered by an owner with an empty log (a 'truncate to 0'
    it would have ignored as a claimer), but the answer came after a had become that owner's
    follower, and a took it as its leader's: it cut records it had acknowledged."""
    o = Owners("ab")
    o.assign("a")
    o.put("a", ["m1"], first=1, token=1)
    a, b = o.logs["a"], o.logs["b"]
    a.assign(["b", "a"], [], 2, o.now)  # (the maps move: a follows b; its fetch is not delivered)
    claim = [x for x in a.assign(["a", "b"], [], 3, o.now) if isinstance(x, PeerFrame)]  # a claims again
    _, _, epoch, end, last_epoch, is_claim = claim[0].frame
    assert b.on_fetch("a", epoch, end, last_epoch, is_claim, o.now) == [SaveSeen(0, epoch)]
    answer = b.seen_saved(epoch, o.now)  # (answered once b's promise is on disk; held back on the way)
    a.assign(["b", "a"], [], 4, o.now)  # a follows b again
    f = answer[0].frame
    out = a.on_data("b", f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], [], f[11], o.now)
    assert not [x for x in out if isinstance(x, Truncate)] and a.end == 2


def test_a_restarted_owner_serves_only_what_its_checkpoint_says_was_committed() -> None:
    """Records past the recovered commit checkpoint are not served until they are committed again."""
    bodies = [message_body(1, ["t", None, None, b"m%d" % i], b"p", i + 1) for i in range(5)]
    recs = [Record(i, 1000 + i, b) for i, b in enumerate(bodies)]
    log = PartitionLog(0, "a", LogSettings(max_uncommitted=2))
    log.recovered(LogScan.of(0, recs, LogSettings().keep, commit=2))
    assert log.commit == 2  # (not end - max_uncommitted = 3)
    got, _ = log.read_committed(0, 10, "t")
    assert got is not None and [r.offset for r in got] == [0, 1]


def _records(o: Owners, member: str) -> list[tuple[int, list[Any]]]:
    return [(r.offset, msgpack.unpackb(r.body, raw=False)) for r in o.disk[member]]


def test_a_fetcher_whose_last_epoch_is_older_than_the_leaders_first_begins_again_at_its_start() -> None:
    """Second review: b's log, after retention and a restart, no longer says where a's epoch ended
    (b's offset 4, y4, was retained away): cut to b's first epoch, a kept its own never-committed
    x4 at offset 4, below the commit."""
    o = Owners("abc")
    o.assign("ab")
    o.put("a", ["m1", "m2", "m3"], first=1, token="a1")
    o.crash("b")
    o.put("a", ["x4", "x5", "x6"], first=4, token="ax")  # (only on a's disk: never committed)
    o.crash("a")
    o.restart("b")
    o.assign("bc", epoch=2)
    o.put("b", ["y4", "y5", "y6", "y7"], first=4, token="by")
    assert "by" in o.committed["b"] and "ax" not in o.committed["a"]
    o.retain("b", 5)
    o.crash("b")
    o.restart("b")
    o.assign("bc", epoch=3)
    o.restart("a")
    for m in "abc":
        o.feed(m, o.logs[m].assign(["b", "a"], ["c"], 4, o.now))
    o.run()
    o.tick(2.0)
    a = o.logs["a"]
    assert a.role == FOLLOWING and a.start == 5 and a.commit == o.logs["b"].commit
    assert _records(o, "a") == _records(o, "b")
    assert all(b[5] != b"x4" for _, b in _records(o, "a") if b[1] == 0)


def test_a_returning_follower_cuts_its_divergent_tail_before_it_takes_the_leaders_commit() -> None:
    """Second review: a took b's commit, past its own 150 never-committed records, before cutting
    them; they folded into its base and the cut then needed a reload that never came."""
    o = Owners("abc", cache_records=100, max_uncommitted=10_000)
    o.assign("ab")
    o.put("a", ["m1"], first=1, token="a1")
    o.crash("b")
    o.put("a", [f"x{i}" for i in range(2, 152)], first=2, token="ax")
    o.crash("a")
    o.restart("b")
    o.assign("bc", epoch=2)
    o.put("b", [f"y{i}" for i in range(2, 302)], first=2, token="by")
    o.restart("a")
    for m in "abc":
        o.feed(m, o.logs[m].assign(["b", "a"], ["c"], 4, o.now))
    o.run()
    o.tick(2.0)
    assert o.put("b", ["z"], first=302, token="bz") == 0
    o.tick(2.0)
    assert "bz" in o.committed["b"] and o.reloads == 0
    assert _records(o, "a") == _records(o, "b")


def _restart_behind_a_later_branch(o: Owners) -> None:
    """a (b down) writes 30 cursor records that are never committed; b, restarted, leads a later
    branch; a restarts holding them (with small caches, most of them not in memory)."""
    o.assign("ab")
    o.put("a", ["m1"], first=1, token="a1")
    o.commit_cursor("a", b"c1", "s", 1)
    o.crash("b")
    for i in range(30):
        o.commit_cursor("a", b"c%d" % i, "s", 2)
    o.crash("a")
    o.restart("b")
    o.assign("bc", epoch=2)
    o.put("b", ["y2"], first=2, token="by")
    o.restart("a")


def test_a_cut_below_the_records_held_in_memory_reads_the_log_again() -> None:
    """a restarts with 30 never-committed cursor records (cursors are outside the room check) and
    keeps only 10 in memory; following b's branch it must cut below them: the shell reads the log
    again (``Reload``), and a's cursors and producers are those of b's log."""
    o = Owners("abc", cache_records=10, max_uncommitted=10)
    _restart_behind_a_later_branch(o)
    assert o.logs["a"].base_at > o.logs["a"].commit
    for m in "abc":
        o.feed(m, o.logs[m].assign(["b", "a"], ["c"], 4, o.now))
    o.run()
    o.tick(2.0)
    a, b = o.logs["a"], o.logs["b"]
    assert o.reloads == 1 and not a.reloading and a.role == FOLLOWING
    assert _records(o, "a") == _records(o, "b")
    assert a.state.cursors == b.state.cursors == {(b"c1", "s"): 1}
    assert a.state.producers == b.state.producers


def test_a_secondary_stepped_down_by_a_claim_its_map_does_not_know_of_follows_its_primary_again() -> None:
    """Second review: x, down in a's and b's maps, came back, claimed (stepping a and b down), and
    died before a or b saw it up; a claimed again and led, b stayed idle: nothing was committed."""
    o = Owners("abx")
    o.down.add("x")
    o.assign("ab")
    o.put("a", ["m1"], first=1, token="a1")
    o.down.discard("x")
    o.feed("x", o.logs["x"].assign(["x", "a"], ["b"], 7, o.now))
    o.run()
    assert o.logs["x"].role == LEADING and o.logs["b"].role not in (FOLLOWING, LEADING)
    o.tick(1.1)  # (x wakes its follower a, the primary of a's map, which claims above x)
    o.crash("x")
    o.tick(1.0)
    assert o.put("a", ["m2"], first=2, token="a2") == 0
    o.tick(1.0)
    assert o.committed["a"] == ["a1", "a2"] and o.logs["b"].role == FOLLOWING and o.payloads("b") == [b"m1", b"m2"]


def test_a_follower_takes_no_records_from_a_leader_below_the_highest_epoch_it_accepted() -> None:
    """Simulator seed 5136: j0's fetch waited at m1 (nothing new); j0 then claimed and led (an EPOCH
    at 12); following m1 again, it took m1's answer to that old fetch, written at m1's lower epoch,
    and put m1's never-committed put at 13, after its own EPOCH: a spliced log that became the
    next leaders' and acknowledged seq 5 of a producer whose seq 1 was gone."""
    o = Owners("abc")
    o.assign("ab")
    o.put("a", ["m1"], first=1, token="a1")
    a, b = o.logs["a"], o.logs["b"]
    assert "b" in a.parked  # (b's next fetch waits at a)
    o.down.add("a")
    for m in "bc":
        o.feed(m, o.logs[m].assign(["b", "c"], [], 5, o.now))
    o.run()
    assert b.role == LEADING and b.epoch > a.epoch and o.disk["b"][-1].offset == 2
    o.down.discard("a")
    o.feed("b", b.assign(["a", "b"], [], 6, o.now))  # (b follows a again: its fetch is above a's epoch)
    st, actions = a.put([["t", None, None, b"x2"], ["t", None, None, b"x3"]], b"p2", 1, 1, lambda s: s, 6000)
    assert st == 0
    o.feed("a", actions)  # (a's answer to b's old fetch: records 2 and 3 of a's epoch)
    o.run()
    epochs = [msgpack.unpackb(r.body, raw=False)[0] for r in o.disk["b"]]
    assert epochs == sorted(epochs), epochs


def _diverged(o: Owners) -> tuple[PartitionLog, PartitionLog]:
    """a (30 never-committed cursor records, 10 in memory) back as b's follower; b leads a later branch."""
    _restart_behind_a_later_branch(o)
    a, b = o.logs["a"], o.logs["b"]
    o.feed("b", b.assign(["b", "a"], ["c"], 4, o.now))
    o.run()
    a.owners, a.role, a.leader = ["b", "a"], FOLLOWING, "b"
    return a, b


def test_an_answer_to_a_resent_fetch_is_not_taken_twice() -> None:
    """Third review: a fetch resent after fetch_retry can be answered twice. The second "cut to 3",
    taken while the first one's Reload was under way, cut all of a's epoch (a reset), and the
    Reload then put back a log the disk no longer had; taken after a plain cut, it cut records the
    leader had committed."""
    o = Owners("abc", cache_records=10, max_uncommitted=10)
    a, b = _diverged(o)
    (d,) = [x for x in b.on_fetch("a", a.seen, a.end, a.last_epoch, False, o.now) if isinstance(x, PeerFrame)]
    f = d.frame
    first = a.on_data("b", f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], [], f[11], o.now)
    assert first == [Reload(0, 3)] and a.reloading
    assert a.on_data("b", f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], [], f[11], o.now) == []
    assert a.retain_limit() == a.start  # (the cursors are not known until the log is read again)
    o.feed("a", first)
    o.run()
    assert not a.reloading and a.end == o.disk["a"][-1].offset + 1 and o.reloads == 1
    assert a.on_data("b", f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], [], f[11], o.now) == []  # (after it)
    o.tick(2.0)
    assert _records(o, "a") == _records(o, "b")


def test_a_member_that_leads_while_its_reload_is_under_way_keeps_what_it_wrote_since() -> None:
    """Its EPOCH goes to disk after the Reload: ``reloaded`` takes it again over what was read."""
    o = Owners("abc", cache_records=10, max_uncommitted=10)
    a, b = _diverged(o)
    (d,) = [x for x in b.on_fetch("a", a.seen, a.end, a.last_epoch, False, o.now) if isinstance(x, PeerFrame)]
    f = d.frame
    reload = a.on_data("b", f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], [], f[11], o.now)
    assert reload == [Reload(0, 3)]
    epoch = a.assign(["a"], [], 5, o.now, alone=True)  # (left the only replica: it leads at once)
    assert a.role == LEADING and a.reloading and [x.records[0].offset for x in epoch if isinstance(x, Append)] == [3]
    assert a.put([["t", None, None, b"z"]], b"p9", 1, 1, lambda s: s, 5000)[0] == 2  # (busy: state unknown)
    o.feed("a", reload + epoch)
    o.run()
    assert not a.reloading and a.end == 4 and [r.offset for r in o.disk["a"]] == [0, 1, 2, 3]
    assert a.state.cursors == {(b"c1", "s"): 1} and a.last_epoch == a.epoch
    assert o.put("a", ["z"], first=1, pid=b"p9", token="az") == 0 and "az" in o.committed["a"]


def test_a_follower_stepped_down_by_a_claim_that_never_reached_its_leader_is_woken() -> None:
    """Third review: b followed a and had fetched; x (a stale map, a out of its reach) claimed and b
    stepped down; x died. The leader woke only followers that had never fetched: b stayed idle."""
    o = Owners("abx")
    o.down.add("x")
    o.assign("ab")
    o.put("a", ["m1"], first=1, token="a1")
    o.down.discard("x")
    o.down.add("a")
    o.feed("x", o.logs["x"].assign(["x", "b"], [], 7, o.now))
    o.run()
    o.down.discard("a")
    o.crash("x")
    assert o.logs["b"].role != FOLLOWING and o.put("a", ["m2"], first=2, token="a2") == 0
    for _ in range(3):
        o.tick(1.0)
    assert o.logs["b"].role == FOLLOWING
    assert o.put("a", ["m2"], first=2, token="a2r") == 0  # (a claimed again: the publisher retries)
    o.tick(1.0)
    assert "a2r" in o.committed["a"] and o.payloads("b") == [b"m1", b"m2"]


def test_an_owner_answers_a_claim_only_once_it_is_on_disk_and_remembers_it_after_a_restart() -> None:
    """Simulator seed 4613: m2 accepted m1's claim, restarted with an empty log (the promise was in
    memory only) and claimed below it, leading with m0, which committed a put; m1 came back, its
    log of the higher epoch won its claim, and the committed put was cut."""
    o = Owners("ab")
    a, b = o.logs["a"], o.logs["b"]
    frames = [x for x in a.assign(["a", "b"], [], 1, o.now) if isinstance(x, PeerFrame)]
    _, _, epoch, end, last_epoch, is_claim = frames[0].frame
    assert b.on_fetch("a", epoch, end, last_epoch, is_claim, o.now) == [SaveSeen(0, epoch)]
    assert b.on_fetch("a", epoch, end, last_epoch, is_claim, o.now) == []  # (a resent claim: one save)
    o.feed("b", [SaveSeen(0, epoch)])
    o.run()
    assert a.role == LEADING and o.seen["b"] == epoch
    o.crash("a")
    o.crash("b")
    o.restart("b")
    b = o.logs["b"]
    assert b.seen == epoch and b.last_epoch == 0  # (b never got a's EPOCH record, but keeps its promise)
    b.assign(["b"], [], 2, o.now, alone=True)
    assert b.epoch > epoch  # (it claims above the claim it accepted, not below)


def fetched_by_an_outsider() -> tuple[Owners, PartitionLog, int]:
    """Owners a and b; x, outside a's map, fetched from a at an epoch above a's (returned)."""
    o = Owners("abx")
    o.down.add("x")
    o.assign("ab")
    o.put("a", ["m1"], first=1, token="a1")
    a = o.logs["a"]
    high = a.epoch + (1 << 22)
    o.feed("a", a.on_fetch("x", high, 5, high, False, o.now))
    return o, a, high


def test_a_claim_goes_on_without_a_member_outside_its_map_that_falls_silent() -> None:
    """Simulator seed 9980: a member our map did not hold live fetched from us at a higher epoch, so
    our claim asked it too; it had the best log and became the claim's source, then died. Its
    death changed no map of ours: the claim copied from it for ever and the partition stalled."""
    o, a, high = fetched_by_an_outsider()
    o.run()
    c = a.claim
    assert c is not None and c.probes == {"b", "x"} and set(c.answers) == {"b"}
    o.feed("a", a.on_data("x", c.epoch, 3, 0, 5, high, 0, -1, -1, [], a.end, o.now))  # (x's answer: the best log)
    o.run()
    assert a.claim is not None and a.claim.source == "x"  # (x dies before it sends a record)
    for _ in range(4):
        o.tick(1.0)
    assert a.role == LEADING and a.epoch > c.epoch
    assert o.put("a", ["m2"], first=2, token="a2") == 0 and "a2" in o.committed["a"]


def test_owners_stepped_down_by_a_claimer_that_died_before_it_led_lead_again() -> None:
    """Fourth review: x's stale map made it primary; its claim stepped a (leading) and b (following)
    down, and x died before any answer reached it. No map of a's or b's changed: nothing woke them."""
    o = Owners("abx")
    o.down.add("x")
    o.assign("ab")
    o.put("a", ["m1"], first=1, token="a1")
    o.down.discard("x")
    frames = o.logs["x"].assign(["x", "a", "b"], [], 7, o.now)
    o.down.add("x")
    for f in frames:
        if isinstance(f, PeerFrame):
            o.deliver("x", f)
    o.run()
    a, b = o.logs["a"], o.logs["b"]
    assert a.role != LEADING and b.role != FOLLOWING
    assert a.next_deadline() <= o.now + 3 * a.s.fetch_retry
    for _ in range(4):
        o.tick(1.0)
    assert a.role == LEADING and b.role == FOLLOWING
    assert o.put("a", ["m2"], first=2, token="a2") == 0 and "a2" in o.committed["a"]


def test_a_claim_counts_only_answers_to_the_claim() -> None:
    """Fourth review: b's answer to a's plain fetch (parked at b) was counted as b's answer to a's
    claim, which b never got: a led although b had not saved (nor seen) the claim."""
    o = Owners("ab")
    o.assign("ba")
    o.put("b", ["m1"], first=1, token="b1")
    a, b = o.logs["a"], o.logs["b"]
    assert "a" in b.parked
    a.assign(["a", "b"], [], 9, o.now)  # (the claim FETCH is lost)
    o.now += 0.6
    for f in b.tick(o.now):  # (b answers a's parked fetch)
        if isinstance(f, PeerFrame):
            o.deliver("b", f)
    o.run()
    assert a.role != LEADING
    o.tick(1.0)  # (the claim is asked again: b saves it, answers, and a leads)
    assert a.role == LEADING and o.seen["b"] >= a.epoch


def test_a_source_is_not_dropped_while_our_own_write_holds_our_fetches_back() -> None:
    """Fourth review: the silence of a claim's source outside our map was counted while our own
    Append ran (we send no fetch then, and drop answers): a prompt source was dropped."""
    o, a, high = fetched_by_an_outsider()
    o.run()
    c = a.claim
    assert c is not None
    o.feed("a", a.on_data("x", c.epoch, 3, 0, 5, high, 0, -1, -1, [], a.end, o.now))
    o.run()
    rec = Record(a.end, 5000, msgpack.packb([high, 2], use_bin_type=True))
    out = a.on_data("x", c.epoch, 3, 0, 5, high, 0, -1, -1, [rec], a.end, o.now)
    assert [type(x) for x in out if type(x) is not Checkpoint] == [Append]  # (the write, no fetch)
    a.tick(o.now + 3.01)  # (the Append is still under way)
    assert a.claim is c and c.source == "x" and "x" in c.probes
