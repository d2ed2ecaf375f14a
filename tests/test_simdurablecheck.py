"""The simulator's durable checker (sim/durablecheck.py) on hand-made histories: it must
catch what the workload could hide (second cold review's findings)."""

from __future__ import annotations

import msgpack

from roost.cluster.logrecords import EPOCH, State, message_body
from roost.node.segmentlog import Record
from sim.check import Checker
from sim.durablecheck import DurableCheck

E0, EO, ER = 1, 2, 3


def test_a_committed_record_missing_from_the_final_log_is_excused_by_nothing_but_the_fsync_policy() -> None:
    """docs/durable.md: leaders are made by the quorum from the in-sync replicas, so no takeover,
    however blind, excuses a committed record missing from the final log; only a power loss
    under fsync = "interval" before the record's sync was due does."""
    dc = DurableCheck(Checker())
    r = Record(5, 1, message_body(ER, ["t", None, None, b"r5"], b"pr", 1))
    dc.committed(0, [r], {"x", "y"}, now=4.0)
    dc.put_acked(0, b"pr", 1, now=4.1)
    assert not dc.excused(0, dc.records[(0, 5, r.body)])
    final = [Record(5, 1, message_body(EO, ["t", None, None, b"o5"], b"po", 1))]
    dc._final_partition(10.0, 0, ["o"], Final(6), {"o": {0: Disk(final)}})
    assert any("is not in the final log of o" in v for v in dc.check.violations), dc.check.violations


class Final:
    """What the checker reads of a leader's log at the end."""

    def __init__(self, commit: int) -> None:
        self.commit = commit
        self.state = State()


class Disk:
    def __init__(self, records: list[Record]) -> None:
        self.records = records


def test_a_record_served_before_any_leader_committed_it_is_a_violation() -> None:
    dc = DurableCheck(Checker())
    r0 = Record(0, 1000, msgpack.packb([5, EPOCH], use_bin_type=True))
    r1 = Record(1, 1000, message_body(5, ["t", None, None, b"m1"], b"pid", 1))
    dc.committed(0, [r0], {"a", "b"}, now=1.0)
    dc.consumer(0, "t", 0)
    dc.records_served(0, 0, [r1], now=2.0)  # (served at t=2 ...)
    dc.consumed(0, "t", 0, 1, b"m1", now=2.0)
    dc.committed(0, [r1], {"a", "b"}, now=3.0)  # (... first committed at t=3)
    dc._final_consumer(10.0, 0, 0, dc.consumers[0], {0: r0.body, 1: r1.body}, "a")
    assert len(dc.check.violations) == 1 and "which no leader had committed by then" in dc.check.violations[0]


def test_fsync_interval_a_record_power_losses_took_from_every_holder_before_its_sync_was_due_is_excused() -> None:
    """docs/durable.md: under fsync = "interval" power losses within the interval can lose an
    acknowledged record, if they take every copy; one written longer ago than that should have been
    synced, and one a holder kept must survive (a restarted shorter log must not win over it)."""
    dc = DurableCheck(Checker())
    due = Record(5, 1, message_body(E0, ["t", None, None, b"m5"], b"p", 5))
    late = Record(6, 1, message_body(E0, ["t", None, None, b"m6"], b"p", 6))
    dc.committed(0, [due, late], {"a", "b"}, now=2.0)
    dc.power_lost("a", [(0, due, 9.9), (0, late, 9.0)], now=10.0, within=0.25)
    assert not dc.excused(0, dc.records[(0, 5, due.body)])  # (b kept it)
    dc.power_lost("b", [(0, due, 9.95), (0, late, 9.0)], now=10.0, within=0.25)
    assert dc.excused(0, dc.records[(0, 5, due.body)])
    assert not dc.excused(0, dc.records[(0, 6, late.body)])


def test_the_simulated_disk_says_what_a_power_loss_took_and_when_it_was_written() -> None:
    import random

    from roost.cluster.partitionlog import Append, Sync
    from sim.logs import SimLogDisk

    disk = SimLogDisk(random.Random(1))
    recs = [Record(o, 1, message_body(E0, ["t", None, None, b"x"], b"p", o + 1)) for o in range(3)]
    at, _ = disk.perform("a", Append(0, recs[:1], False), 1.0)
    assert disk.perform("a", Sync(0), 1.1) == (1.1, None)  # (not answered)
    at2, _ = disk.perform("a", Append(0, recs[1:], False), 2.0)
    assert disk.power_loss("a") == [(0, recs[1], at2), (0, recs[2], at2)] and at < at2
    assert disk.logs["a"][0].records == recs[:1]
