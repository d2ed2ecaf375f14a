"""The partition log core's disk policy (cluster/logdisk.py): when it asks for an fsync, what the
commit checkpoint says, and the broken builds it is configured with (sim/breaks.py)."""

from __future__ import annotations

import math

from roost.cluster.logdisk import DiskPolicy
from roost.cluster.partitionlog import Append, Checkpoint, LogSettings, Sync, Truncate
from roost.node.segmentlog import Record
from tests.test_partitionlog import Owners


def _recs(start: int, n: int) -> list[Record]:
    return [Record(o, 1000, b"x") for o in range(start, start + n)]


def test_always_syncs_every_append_and_asks_no_sync() -> None:
    d = DiskPolicy(0, LogSettings(fsync="always"))
    assert d.append(_recs(0, 2), 0) == [Append(0, _recs(0, 2), True)]
    d.written(1.0)
    assert d.next_deadline() == math.inf and d.tick(100.0) == []


def test_interval_asks_a_sync_once_a_written_record_has_waited_the_interval() -> None:
    d = DiskPolicy(0, LogSettings(fsync="interval", fsync_interval=0.5))
    assert d.next_deadline() == math.inf  # (nothing written: nothing to sync)
    assert d.append(_recs(0, 2), 0) == [Append(0, _recs(0, 2), False)]
    d.written(1.0)
    d.append(_recs(2, 1), 0)
    d.written(1.2)  # (the clock runs from the first unsynced write)
    assert d.next_deadline() == 1.5 and d.tick(1.49) == []
    assert d.tick(1.5) == [Sync(0)]  # (it covers every Append asked before it)
    d.written(1.6)  # (an answer to an Append asked before the Sync: nothing more to sync)
    assert d.next_deadline() == math.inf and d.tick(9.0) == []
    d.append(_recs(3, 1), 0)
    d.written(9.0)
    assert d.next_deadline() == 9.5 and d.tick(9.5) == [Sync(0)]
    d.recovered(0)  # (opened at start: what the last process wrote may not be synced)
    assert d.next_deadline() == 0.0 and d.tick(20.0) == [Sync(0)] and d.next_deadline() == math.inf


def test_never_and_the_no_fsync_break_sync_nothing() -> None:
    for s in (LogSettings(fsync="never"), LogSettings(fsync="always", breaks=frozenset({"no-fsync"})),
              LogSettings(fsync="interval", breaks=frozenset({"no-fsync"}))):  # fmt: skip
        d = DiskPolicy(0, s)
        assert d.append(_recs(0, 1), 0) == [Append(0, _recs(0, 1), False)]
        d.written(1.0)
        assert d.next_deadline() == math.inf and d.tick(100.0) == []


def test_the_checkpoint_follows_its_records_grows_with_the_commit_and_is_lowered_before_a_cut() -> None:
    d = DiskPolicy(0, LogSettings())
    d.recovered(3)  # (what the file held at start)
    assert d.append(_recs(5, 1), 2) == [Append(0, _recs(5, 1), True)]  # (an older commit never lowers it)
    assert d.append(_recs(6, 1), 5) == [Append(0, _recs(6, 1), True), Checkpoint(0, 5)]
    assert d.cut(6) == [] and d.cut(4) == [Checkpoint(0, 4)] and d.cut(4) == []


def test_a_follower_cut_below_its_checkpoint_lowers_it_first() -> None:
    """A checkpoint past a cut would count the next branch's records there as committed after a
    restart (cold review): the core asks for the lower one before the cut."""
    o = Owners("ab")
    o.elect("a", "ab")
    o.put("a", ["m1", "m2", "m3"])
    o.tick(1.0)
    o.put("a", ["m4"], first=4)  # (b's next append carries the commit it learnt meanwhile)
    b = o.logs["b"]
    assert o.checkpoint["b"] == 4 == b.disk.checkpointed
    assert b._copy(0, 2, -1, []) == [Checkpoint(0, 2), Truncate(0, 2)] and b.disk.checkpointed == 2


def test_interval_through_the_core_acknowledges_once_written_and_syncs_by_its_deadline() -> None:
    """docs/durable.md: under interval a put is acknowledged once written on every owner, and each
    log is fsynced within fsync_interval of a write (its deadline is the core's)."""
    o = Owners("ab", fsync="interval", fsync_interval=0.3)
    o.elect("a", "ab")
    a = o.logs["a"]
    status, actions = a.put([["t", None, None, b"m1"]], b"p1", 1, 1, lambda last: "t1", 5000)
    assert status == 0 and [x.sync for x in actions if isinstance(x, Append)] == [False]
    o.feed("a", actions)
    o.run()
    assert o.committed["a"] == ["t1"]  # (written on both: acknowledged before any sync)
    due = a.next_deadline()
    assert due <= o.now + 0.3
    o.now = a.disk.next_deadline()
    assert Sync(0) in a.tick(o.now) and a.disk.next_deadline() == math.inf


def test_the_early_ack_break_commits_without_the_follower() -> None:
    for breaks, acked in ((frozenset(), []), (frozenset({"early-ack"}), ["t1"])):
        o = Owners("ab", breaks=breaks)
        o.elect("a", "ab")
        o.down.add("b")  # (the follower hears nothing)
        o.put("a", ["m1"], token="t1")
        assert o.committed["a"] == acked
