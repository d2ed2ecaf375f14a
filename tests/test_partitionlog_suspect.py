"""A log restarted under an fsync policy that can lose written records (cluster/partitionlog.py,
"suspect"): it declines to lead until it caught up, so a shorter log never cuts a record that an
in-sync copy kept (the Owners harness of tests/test_partitionlog.py; its controller answers a
``Decline`` with cluster/controller.py ``decline``)."""

from __future__ import annotations

from roost.cluster.controller import decide_one
from roost.cluster.partitionlog import FOLLOWING, IDLE, LEADING, Decline, Recovered, Reelect
from tests.test_partitionlog import Owners


def power_loss(o: Owners, member: str, keep: int) -> None:
    """``member`` dies and its disk keeps only its first ``keep`` records (the rest was not synced)."""
    o.crash(member)
    o.disk[member] = o.disk[member][:keep]
    o.checkpoint[member] = min(o.checkpoint[member], keep)


def test_a_restarted_leader_that_lost_a_committed_record_declines_and_the_record_survives() -> None:
    o = Owners("abc", fsync="interval")
    o.elect("a", "abc")
    o.put("a", ["m1", "m2"], token="t")
    assert o.committed["a"] == ["t"] and o.payloads("b") == [b"m1", b"m2"]
    power_loss(o, "a", 2)  # (its EPOCH and m1 were synced, m2 was not)
    before = len(o.requests)
    o.restart("a")  # (within failure detection: the quorum still names it)
    asked = [r for m, r in o.requests[before:] if m == "a"]
    assert Decline(0, 2, o.logs["b"].epochs[0][0]) in asked and not any(isinstance(r, Reelect) for r in asked)
    assert (o.lead.leader, o.logs["b"].role, o.logs["a"].role) == ("b", LEADING, FOLLOWING)
    o.tick(2.0)
    assert o.payloads("a") == o.payloads("b") == o.payloads("c") == [b"m1", b"m2"]
    assert not o.logs["a"].suspect  # (caught up from b: it may lead again)
    o.elect("a")
    assert o.logs["a"].role == LEADING and o.put("a", ["m3"], first=3, token="t3") == 0
    o.tick(2.0)
    assert o.payloads("c") == [b"m1", b"m2", b"m3"]


def test_under_fsync_always_a_restarted_leader_is_not_suspect() -> None:
    o = Owners("abc")
    o.elect("a", "abc")
    o.put("a", ["m1"], token="t")
    o.crash("a")
    o.restart("a")
    assert not any(isinstance(r, Decline) for _, r in o.requests)
    assert (o.lead.leader, o.logs["a"].role) == ("a", LEADING)


def test_when_every_isr_member_lost_records_the_longest_log_leads_and_nothing_it_kept_is_cut() -> None:
    o = Owners("abc", fsync="interval")
    o.elect("a", "abc")
    o.put("a", ["m1", "m2", "m3"], token="t")
    assert o.committed["a"] == ["t"]
    for m, keep in (("a", 2), ("b", 4), ("c", 3)):  # (a full restart: each kept another part)
        power_loss(o, m, keep)
    for m in "abc":
        o.restart(m)
    for _ in range(4):  # (each declines once named, a fetch_retry apart at most)
        o.tick(1.0)
    assert (o.lead.leader, o.lead.isr) in {("b", ("b",)), ("b", ("a", "b")), ("b", ("b", "c")), ("b", ("a", "b", "c"))}
    o.tick(2.0)
    o.tick(2.0)
    assert o.payloads("a") == o.payloads("b") == o.payloads("c") == [b"m1", b"m2", b"m3"]
    assert o.lead.isr == ("a", "b", "c")  # (the others caught up and were added again)


def test_a_suspect_waits_for_an_isr_member_that_is_down_and_did_not_decline() -> None:
    o = Owners("abc", fsync="interval")
    o.elect("a", "ab")
    o.put("a", ["m1", "m2"], token="t")
    power_loss(o, "a", 2)
    o.crash("b")  # (b holds m2 and is down)
    o.restart("a")
    o.tick(1.0)
    assert (o.lead.leader, o.logs["a"].role) == ("a", IDLE)  # (named, but it does not lead: it waits for b)
    o.restart("b")  # (b is suspect too, but a declined before it: b is named and a's report says shorter)
    for _ in range(4):
        o.tick(1.0)
    assert o.lead.leader == "b" and o.logs["b"].role == LEADING
    o.tick(2.0)
    assert o.payloads("a") == o.payloads("b") == [b"m1", b"m2"]


def controller_round(o: Owners, live: set[str]) -> None:
    """The controller's ``decide`` over partition 0, passing over the members that reported."""
    c = decide_one(0, o.lead, o.lead.replicas, frozenset(live), o.reports)
    if c is not None and o.meta.allows(c):
        o.apply(c)
        o.run()


def controller_rounds(o: Owners, live: set[str], n: int) -> None:
    """``n`` controller rounds, a second of the logs' time after each."""
    for _ in range(n):
        controller_round(o, live)
        o.tick(1.0)


def test_a_cut_off_leader_that_kept_every_record_is_waited_for_when_the_others_lost_power() -> None:
    """Review: with a cut off (its disk whole) and a and b restarted from a power loss, the
    controller named a, dropping c from the ISR in the same decision; a and b declined and the
    longer of them led alone: c's m2 and m3 were cut when it came back. Suspects now report
    themselves at once, so the controller names neither, keeps c in the ISR and waits for it."""
    o = Owners("abc", fsync="interval")
    o.elect("c", "abc", "abc")
    o.put("c", ["m1", "m2", "m3"], token="t")
    assert o.committed["c"] == ["t"] and o.payloads("a") == [b"m1", b"m2", b"m3"]
    o.pause("c")
    o.deaf.add("c")
    power_loss(o, "a", 2)
    power_loss(o, "b", 2)
    o.restart("a")
    o.restart("b")
    assert set(o.reports) == {"a", "b"}
    controller_rounds(o, {"a", "b"}, 4)
    assert o.lead.leader is None and o.lead.isr == ("a", "b", "c")
    o.resume("c")
    controller_rounds(o, {"a", "b", "c"}, 4)
    assert o.payloads("a") == o.payloads("b") == o.payloads("c") == [b"m1", b"m2", b"m3"]
    assert any(isinstance(r, Recovered) for _, r in o.requests) and not o.reports
    assert o.lead.leader == "a" and o.logs["a"].role == LEADING  # (c led first; a, caught up, is preferred)


def test_a_named_suspect_waiting_for_a_down_member_does_not_let_it_be_dropped() -> None:
    """Second review: a led {a,b,c}; a and c lost m2 and m3 to a power loss, b was down with its
    disk whole. a, still named, declined and waited for b; but the controller dropped b as a dead
    follower, and the longer of a and c then led alone: b's copy was cut. The controller drops
    nobody now; only a leader that began its epoch asks to drop a follower held down."""
    o = Owners("abc", fsync="interval")
    o.elect("a", "abc", "abc")
    o.put("a", ["m1", "m2", "m3"], token="t")
    assert o.committed["a"] == ["t"] and o.payloads("b") == [b"m1", b"m2", b"m3"]
    o.crash("b")
    power_loss(o, "a", 2)
    power_loss(o, "c", 2)
    o.restart("a")
    o.restart("c")
    controller_rounds(o, {"a", "c"}, 4)
    assert "b" in o.lead.isr and o.logs["a"].role == IDLE
    o.restart("b")
    controller_rounds(o, {"a", "b", "c"}, 6)
    assert o.payloads("a") == o.payloads("b") == o.payloads("c") == [b"m1", b"m2", b"m3"]


def test_suspects_named_before_their_reports_came_cut_nothing_a_down_member_kept() -> None:
    """Second review: the controller decided before a's and b's reports came (a new controller, or
    the race with a restart), named a and dropped c, the dead leader, in the same decision; the
    longer of a and b then led alone and c's m2 and m3 were cut. c now stays in the ISR."""
    o = Owners("abc", fsync="interval")
    o.elect("c", "abc", "abc")
    o.put("c", ["m1", "m2", "m3"], token="t")
    o.pause("c")
    o.deaf.add("c")
    power_loss(o, "a", 2)
    power_loss(o, "b", 2)
    o.quorum_open = False  # (their reports are on the way, or lost with a controller change)
    o.restart("a")
    o.restart("b")
    o.reports.clear()
    controller_round(o, {"a", "b"})  # (the controller's first round knows of no suspect)
    assert o.lead.leader == "a" and "c" in o.lead.isr
    o.quorum_open = True
    controller_rounds(o, {"a", "b"}, 6)
    assert o.logs["a"].role != LEADING and o.logs["b"].role != LEADING and "c" in o.lead.isr
    o.resume("c")
    controller_rounds(o, {"a", "b", "c"}, 6)
    assert o.payloads("a") == o.payloads("b") == o.payloads("c") == [b"m1", b"m2", b"m3"]


def test_when_every_isr_member_reported_as_a_follower_the_longest_log_is_named() -> None:
    """Second review: b and c restarted and reported while a was down; a came back, suspect too,
    and reported as a follower (nobody was named): nobody ever led. ``decide`` now names the
    longest log alone once every ISR member has reported."""
    o = Owners("abc", fsync="interval")
    o.elect("a", "abc", "abc")
    o.put("a", ["m1", "m2"], token="t")
    for m in "bca":
        o.crash(m)
    o.restart("b")
    o.restart("c")
    controller_round(o, {"b", "c"})
    assert o.lead.leader is None  # (a, not reported, is down: it may hold what they lost)
    o.restart("a")
    controller_rounds(o, {"a", "b", "c"}, 10)
    assert o.lead.leader is not None and o.logs[o.lead.leader].role == LEADING
    assert o.payloads("a") == o.payloads("b") == o.payloads("c") == [b"m1", b"m2"]


def test_a_leader_drops_a_follower_its_map_holds_down_at_once_but_never_below_min_insync() -> None:
    o = Owners("abc")
    o.elect("a", "abc")
    assert o.lead.isr == ("a", "b", "c")
    o.crash("c")
    o.feed("a", o.logs["a"].peers_down(frozenset({"c"}), o.now))
    o.run()
    assert o.lead.isr == ("a", "b")  # (not after isr_lag_time: at once)
    o.crash("b")
    o.feed("a", o.logs["a"].peers_down(frozenset({"b", "c"}), o.now))
    o.run()
    assert o.lead.isr == ("a", "b")  # (min_insync 2)
    assert o.put("a", ["m1"], token="t") == 0 and o.committed["a"] == []  # (it waits for b)
