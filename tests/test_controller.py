"""The metadata quorum's state machine and the controller's policy (cluster/controller.py)."""

from __future__ import annotations

import random

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roost.cluster.controller import (
    SET,
    CommandError,
    Leadership,
    Metadata,
    SetPartition,
    alter_isr,
    decide,
    decide_one,
    decline,
    decode_untrusted_command,
    targets,
)

ABC = ("a", "b", "c")


def applied(meta: Metadata, *cmds: SetPartition) -> list[int | None]:
    return [meta.apply(meta.applied + 1, c.encode()) for c in cmds]


def led(leader: str | None = "a", epoch: int = 1, isr: tuple[str, ...] = ABC, reps: tuple[str, ...] = ABC) -> Metadata:
    meta = Metadata()
    applied(meta, SetPartition(0, 0, "a", 1, reps, reps))
    if (leader, epoch, isr) != ("a", 1, reps):
        applied(meta, SetPartition(0, 1, leader, epoch, isr, reps))
    return meta


# ---------------------------------------------------------------- apply: the rules hold whoever proposes


def test_a_set_applies_only_to_the_version_it_names_and_every_change_raises_the_version():
    meta = Metadata()
    assert applied(meta, SetPartition(0, 0, "a", 1, ABC, ABC)) == [0]
    assert meta.partitions[0].version == 1
    # two decisions made from version 1: the first applies, the second is stale
    assert applied(meta, SetPartition(0, 1, "a", 1, ("a", "b"), ABC), SetPartition(0, 1, "b", 2, ABC, ABC)) == [0, None]
    assert meta.partitions[0].isr == ("a", "b") and meta.partitions[0].leader == "a" and meta.refused == 1


@pytest.mark.parametrize(
    "change,why",
    [
        (SetPartition(0, 1, "b", 1, ABC, ABC), "a new leader at the same epoch"),
        (SetPartition(0, 1, "a", 0, ABC, ABC), "an epoch that falls"),
        (SetPartition(0, 1, None, 1, ABC, ABC), "no leader at the same epoch"),
        (SetPartition(0, 1, "c", 2, ("a", "b"), ABC), "a leader out of the ISR (unclean)"),
        (SetPartition(0, 1, "a", 1, ("a", "d"), ABC), "an ISR member that is no replica"),
        (SetPartition(0, 2, "c", 2, ("c",), ABC), "a new leader from out of the ISR (unclean)"),
        (SetPartition(0, 2, "b", 2, ("a", "b", "c"), ABC), "a new epoch that adds to the ISR"),
    ],
)
def test_apply_refuses_what_breaks_the_rules(change, why):
    meta = led() if change.version == 1 else led("a", 1, ("a", "b"))
    assert applied(meta, change) == [None], why
    assert meta.partitions[0].leader == "a" and meta.partitions[0].epoch == 1 and meta.refused == 1


def test_an_empty_command_is_a_raft_leaders_first_entry_and_garbage_is_refused_and_counted():
    meta = led()
    assert meta.apply(10, b"") is None and meta.applied == 10 and meta.refused == 0
    assert meta.apply(11, b"\xc1") is None and meta.refused == 1 and meta.partitions[0].epoch == 1


@pytest.mark.parametrize(
    "obj",
    [
        [],
        [SET],
        [2, 0, 0, "a", 1, ["a"], ["a"]],
        [SET, -1, 0, "a", 1, ["a"], ["a"]],
        [SET, 65536, 0, "a", 1, ["a"], ["a"]],
        [SET, 0, 0, "", 1, ["a"], ["a"]],
        [SET, 0, 0, "x" * 65, 1, ["a"], ["a"]],
        [SET, 0, 0, "a", 1 << 62, ["a"], ["a"]],
        [SET, 0, 0, "a", 1, [], ["a"]],
        [SET, 0, 0, "a", 1, ["a", "a"], ["a"]],
        [SET, 0, 0, "a", 1, ["a"], [f"m{i}" for i in range(9)]],
        [SET, 0, 0, "a", 1.0, ["a"], ["a"]],
        [SET, 0, True, "a", 1, ["a"], ["a"]],
        {"a": 1},
    ],
)
def test_decode_untrusted_command_names_what_is_wrong(obj):
    with pytest.raises(CommandError):
        decode_untrusted_command(msgpack.packb(obj))


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=70)
                    | st.binary(max_size=8), lambda xs: st.lists(xs, max_size=8), max_leaves=30))  # fmt: skip
def test_decode_untrusted_command_only_ever_raises_command_error(obj):
    try:
        c = decode_untrusted_command(msgpack.packb(obj))
    except CommandError:
        return
    assert decode_untrusted_command(c.encode()) == c


def test_a_snapshot_restores_the_same_state_and_a_bad_one_is_refused_naming_why():
    meta = led("b", 2, ("b", "c"))
    applied(meta, SetPartition(5, 0, None, 1, ("c",), ("c",)))
    back = Metadata.restore_untrusted(meta.snapshot())
    assert back.partitions == meta.partitions and back.applied == meta.applied
    for bad, why in [
        (b"\x00", "snapshot must be"),
        (msgpack.packb([1, [[0, 1, "z", 1, ["a"], ["a"]]]]), "break the rules"),
        (msgpack.packb([1, [[0, 1, "a", 1, ["a"], ["a"]], [0, 1, "a", 1, ["a"], ["a"]]]]), "twice"),
        (msgpack.packb([1, [[0, 0, "a", 1, ["a"], ["a"]]]]), "version 0"),
        (msgpack.packb([-1, []]), "applied"),
    ]:
        with pytest.raises(CommandError, match=why):
            Metadata.restore_untrusted(bad)


# ---------------------------------------------------------------- the controller's policy


def test_a_new_partition_is_led_by_its_first_live_replica_with_every_replica_in_sync():
    t = targets(["a", "b", "c", "d"], 8, 3)
    assert all(len(r) == 3 and len(set(r)) == 3 for r in t)
    c = decide_one(0, None, t[0], frozenset(t[0][1:]))
    assert c is not None and c.leader == t[0][1] and c.isr == t[0] == c.replicas and c.epoch == 1


def test_a_dead_leader_is_replaced_from_the_isr_and_stays_in_it_for_the_new_leader_to_drop():
    meta = led()
    c = decide_one(0, meta.partitions[0], ABC, frozenset({"b", "c"}))
    assert c is not None and (c.leader, c.epoch, c.isr) == ("b", 2, ABC)


def test_no_live_isr_member_means_no_leader_at_a_higher_epoch_until_one_returns():
    meta = led("a", 3, ("a", "b"))
    c = decide_one(0, meta.partitions[0], ABC, frozenset({"c"}))  # (c is live but out of sync: never leads)
    assert c is not None and (c.leader, c.epoch, c.isr) == (None, 4, ("a", "b"))
    applied(meta, c)
    back = decide_one(0, meta.partitions[0], ABC, frozenset({"b", "c"}))
    assert back is not None and (back.leader, back.epoch, back.isr) == ("b", 5, ("a", "b"))


def test_the_controller_drops_no_follower_it_sees_down_its_leader_does():
    """Review: the controller dropped a down follower, the only intact copy, while the leader it
    kept was a suspect that could not lead; only a leader that began its epoch holds every committed
    record, so the drop is its own (cluster/partitionlog.py ``peers_down``)."""
    meta = led()
    assert decide_one(0, meta.partitions[0], ABC, frozenset({"a", "b"})) is None
    assert decide_one(0, meta.partitions[0], ABC, frozenset({"a"})) is None


def test_with_no_leader_and_every_isr_member_reported_the_longest_log_leads_alone():
    """Review: every ISR member had reported itself suspect as a follower, nobody was named, and
    nothing applied the longest-log rule: the partition had no leader for ever."""
    meta = led(None, 2, ABC)
    c = decide_one(0, meta.partitions[0], ABC, frozenset("abc"), {"a": (1, 3), "b": (1, 3)})
    assert c is not None and (c.leader, c.isr) == ("c", ABC)  # (c did not report: it leads, all stay)
    c = decide_one(0, meta.partitions[0], ABC, frozenset("abc"), {"a": (1, 3), "b": (1, 5), "c": (1, 4)})
    assert c is not None and (c.leader, c.epoch, c.isr) == ("b", 3, ("b",))


def test_the_preferred_replica_takes_the_lead_back_once_in_sync_and_not_before():
    meta = led("b", 2, ("b", "c"))
    assert decide_one(0, meta.partitions[0], ABC, frozenset(ABC)) is None  # (a is live, not in sync)
    applied(meta, SetPartition(0, meta.partitions[0].version, "b", 2, ABC, ABC))
    c = decide_one(0, meta.partitions[0], ABC, frozenset(ABC))
    assert c is not None and (c.leader, c.epoch) == ("a", 3)


def test_a_placement_change_adds_the_new_replica_first_and_drops_the_old_once_it_is_in_sync():
    meta = led()
    target = ("a", "b", "d")
    step1 = decide_one(0, meta.partitions[0], target, frozenset("abcd"))
    assert step1 is not None and step1.replicas == ("a", "b", "d", "c") and step1.isr == ("a", "b", "c")
    applied(meta, step1)
    assert decide_one(0, meta.partitions[0], target, frozenset("abcd")) is None  # (d not in sync yet)
    grow = alter_isr(meta, 0, "a", 1, ("a", "b", "c", "d"))
    assert grow is not None
    applied(meta, grow)
    step2 = decide_one(0, meta.partitions[0], target, frozenset("abcd"))
    assert step2 is not None and step2.replicas == target == step2.isr and step2.leader == "a"


def test_a_leader_that_leaves_its_replicas_hands_over_to_an_in_sync_one():
    meta = led("c", 2, ("c", "a"), ("c", "a", "b"))
    assert decide_one(0, meta.partitions[0], ("a", "b"), frozenset("abc")) is None  # (c left; b not in sync)
    grow = alter_isr(meta, 0, "c", 2, ("c", "a", "b"))
    assert grow is not None
    applied(meta, grow)
    c = decide_one(0, meta.partitions[0], ("a", "b"), frozenset("abc"))
    assert c is not None and c.replicas == ("a", "b") == c.isr and c.leader == "a" and c.epoch == 3


def test_alter_isr_is_taken_only_from_the_leader_at_its_epoch():
    meta = led()
    assert alter_isr(meta, 0, "b", 1, ("a", "b")) is None  # (not the leader)
    assert alter_isr(meta, 0, "a", 0, ("a", "b")) is None  # (an old epoch)
    assert alter_isr(meta, 0, "a", 1, ("b", "c")) is None  # (the leader would leave its ISR)
    assert alter_isr(meta, 0, "a", 1, ("a", "d")) is None  # (not a replica)
    assert alter_isr(meta, 1, "a", 1, ("a",)) is None  # (no such partition)
    c = alter_isr(meta, 0, "a", 1, ("a", "c"))
    assert c is not None and applied(meta, c) == [0] and meta.partitions[0].isr == ("a", "c")


def test_decide_proposes_only_what_applies_and_nothing_once_settled():
    meta = Metadata()
    live = frozenset("abcd")
    first = decide(meta, "abcd", live, 4, 3)
    assert len(first) == 4
    applied(meta, *first)
    assert decide(meta, "abcd", live, 4, 3) == []


def test_a_dead_leader_at_the_min_insync_floor_stays_in_the_isr_and_a_suspect_waits_for_it() -> None:
    """Seed 20196 (fsync = interval): b lost a committed record in a power loss and came back; then
    the leader a died, which held it. Had a left the ISR as b took over, b's shorter log would have
    been the only one in sync. a stays (at min_insync it would not leave as a follower either), so
    when b declines the partition waits for a, and a leads once back."""
    meta = led("a", 1, ("a", "b"))
    c = decide_one(0, meta.partitions[0], ABC, frozenset({"b", "c"}))
    assert c is not None and (c.leader, c.epoch, c.isr) == ("b", 2, ("a", "b"))
    applied(meta, c)
    assert decline(meta, 0, "b", {"b": (1, 3)}, frozenset({"b", "c"})) is None  # (a may hold what b lost)
    back = decline(meta, 0, "b", {"b": (1, 3)}, frozenset("abc"))
    assert back is not None and (back.leader, back.epoch, back.isr) == ("a", 3, ("a", "b"))


def test_decline_names_a_live_isr_member_that_has_not_declined_then_the_longest_log_alone() -> None:
    meta = led()
    first = decline(meta, 0, "a", {"a": (1, 5)}, frozenset("abc"))
    assert first is not None and (first.leader, first.epoch, first.isr) == ("b", 2, ABC)
    applied(meta, first)
    assert decline(meta, 0, "a", {"a": (1, 5)}, frozenset("abc")) is None  # (only the leader declines)
    assert decide_one(0, meta.partitions[0], ABC, frozenset("abc"), {"a": (1, 5)}) is None  # (not preferred now)
    back = decide_one(0, meta.partitions[0], ABC, frozenset("abc"))
    assert back is not None and back.leader == "a"  # (without its report it would take the lead back)
    reports = {"a": (1, 5), "b": (2, 1)}
    c = decline(meta, 0, "b", reports, frozenset("abc"))
    assert c is not None and c.leader == "c"
    applied(meta, c)
    reports["c"] = (1, 9)  # (the latest last epoch wins over more records)
    last = decline(meta, 0, "c", reports, frozenset("abc"))
    assert last is not None and (last.leader, last.isr) == ("b", ("b",))
    applied(meta, last)
    tie = decline(meta, 0, "b", {"b": (2, 1)}, frozenset("abc"))  # (alone: it is named again, a new epoch)
    assert tie is not None and (tie.leader, tie.epoch, tie.isr) == ("b", last.epoch + 1, ("b",))


# ---------------------------------------------------------------- the promise, over random histories


def run_history(seed: int, min_insync: int = 2, unclean: bool = False) -> list[str]:
    """A partition's leadership through random deaths, returns, ISR shrinks and growths and
    placement changes, with records committed as the data path commits them (on the leader and
    every ISR member, only with ``min_insync`` of them); returns every time a leader or an ISR
    member lacked a committed record. ``unclean``: the controller may also pick a live replica
    out of sync (the broken build the rules must catch)."""
    rng = random.Random(seed)
    members = "abcde"
    placed = list("abcd")
    live = set(members)
    meta = Metadata()
    holds: dict[str, set[int]] = {m: set() for m in members}
    committed: set[int] = set()
    broken: list[str] = []
    for step in range(300):
        lead = meta.partitions.get(0)
        r = rng.random()
        if r < 0.15:
            (live.discard if rng.random() < 0.6 else live.add)(rng.choice(members))
        elif r < 0.2:
            placed = sorted(rng.sample(members, rng.randint(3, 5)))
        elif lead is not None and lead.leader is not None and lead.leader in live:
            if r < 0.6:  # a put
                holders = [m for m in lead.isr if m in live and rng.random() < 0.9]
                for m in holders:
                    holds[m].add(step)
                if set(holders) == set(lead.isr) and len(lead.isr) >= min_insync:
                    committed.add(step)
            elif r < 0.75:  # the leader drops a lagging follower (never below min_insync)
                rest = [m for m in lead.isr if m != lead.leader]
                if rest and len(lead.isr) > min_insync:
                    c = alter_isr(meta, 0, lead.leader, lead.epoch, [m for m in lead.isr if m != rng.choice(rest)])
                    if c is not None:
                        meta.apply(meta.applied + 1, c.encode())
            else:  # a live follower catches up (fetches everything the leader has) and joins
                out = [m for m in lead.replicas if m not in lead.isr and m in live]
                if out:
                    f = rng.choice(out)
                    holds[f] |= holds[lead.leader]
                    c = alter_isr(meta, 0, lead.leader, lead.epoch, [*lead.isr, f])
                    if c is not None:
                        meta.apply(meta.applied + 1, c.encode())
        for c in decide(meta, placed, frozenset(live), 1, 3):
            if unclean and c.leader is None:
                now = meta.partitions[0]
                other = next((m for m in now.replicas if m in live), None)
                if other is not None:
                    c = SetPartition(0, now.version, other, c.epoch, (*c.isr, other) if other not in c.isr else c.isr,
                                     now.replicas)  # fmt: skip
            if meta.apply(meta.applied + 1, c.encode()) is None:  # (the broken controller's SET, forced)
                meta.partitions[0] = Leadership(c.replicas, c.leader, c.epoch, c.isr, c.version + 1)
        lead = meta.partitions.get(0)
        if lead is not None:
            for m in {*lead.isr, *([lead.leader] if lead.leader else [])}:
                if not committed <= holds[m]:
                    broken.append(f"seed {seed} step {step}: {m} ({lead}) lacks {sorted(committed - holds[m])[:3]}")
    return broken


def test_every_leader_and_isr_member_holds_every_committed_record_over_300_random_histories():
    assert [b for seed in range(300) for b in run_history(seed)[:1]] == []


def test_the_history_check_catches_an_unclean_election():
    assert any(run_history(seed, unclean=True) for seed in range(300))
