"""A member's part in the metadata quorum (cluster/quorum.py): contact, and what a peer's frames may
do to it; the Raft core and the controller's rules have their own tests."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from roost.cluster.controller import SetPartition
from roost.cluster.links import LinkTable
from roost.cluster.peerwire import PeerProtocolError, PeerType
from roost.cluster.quorum import Quorum
from roost.cluster.raftactions import RaftPersist, RaftSettings, Stored
from roost.cluster.raftwire import AppendEntries, InstallSnapshot, encode

SETTINGS = RaftSettings(election_timeout=1.0, heartbeat_interval=0.1)


def quorum(me: str, voters: tuple[str, ...], members: list[str], stored: Stored) -> tuple[Quorum, list[Any]]:
    out: list[Any] = []
    q = Quorum(me, voters, members, SETTINGS, 4, 1, random.Random(7), LinkTable([m for m in members if m != me],
               out), out)  # fmt: skip
    q.started(stored, 0.0)
    return q, out


def sync_all(q: Quorum, out: list[Any], now: float) -> set[int]:
    """The shell syncs every persist asked for so far."""
    changed: set[int] = set()
    while persists := [a for a in out if isinstance(a, RaftPersist)]:
        out.clear()
        for a in persists:
            changed |= q.persisted(a.token, now)
    return changed


def run_until(q: Quorum, out: list[Any], done: Callable[[float], bool]) -> float:
    """The shell syncs each persist as it is asked, and time moves to the core's next deadline when
    none is, until ``done`` (at most 50 steps); returns the time then."""
    t = 0.0
    for _ in range(50):
        if done(t):
            break
        asked = [a for a in out if isinstance(a, RaftPersist)]
        out.clear()
        for a in asked:
            q.persisted(a.token, t)
        if not asked:
            t = max(t, q.deadline())
            q.tick(t, [], frozenset())
    return t


def test_a_restarted_leader_has_no_contact_until_an_entry_of_its_own_term_is_committed() -> None:
    """Review: a new Raft leader's commit starts at its snapshot; in contact at once, its members
    acted on a table older than what was committed before the restart (a partition leader began
    an epoch twice). Contact waits until the leader's no-op of its term is committed: by then the
    table holds every SET committed before."""
    old = SetPartition(0, 0, "a", 1, ("a",), ("a",)).encode()
    newer = SetPartition(0, 1, "a", 5, ("a",), ("a",)).encode()
    q, out = quorum("a", ("a",), ["a"], Stored(3, "a", 0, 0, None, [(2, old), (3, newer)]))
    # (its vote is synced as it asks: once it leads, its no-op waits on disk)
    t = run_until(q, out, lambda t: q.raft is None or q.raft.role == "leader")
    assert q.raft is not None and q.raft.role == "leader" and q.raft.lease_valid(t)  # (its own lease: one voter)
    assert not q.contact(t) and q.leadership(0) is None  # (the stored SETs are not known committed yet)
    changed = sync_all(q, out, t)
    assert q.contact(t) and changed == {0}
    lead = q.leadership(0)
    assert lead is not None and lead.epoch == 5  # (the newest committed table, never the older one first)


def test_an_append_from_a_member_that_is_not_the_leader_gives_no_contact() -> None:
    """Review: the contact marks moved before the core checked the sender; a learner's heartbeat
    kept a member in contact, or one with a huge commit took it away for good."""
    q, _ = quorum("b", ("a", "b", "c"), ["a", "b", "c", "d"], Stored())
    q.on_raft("d", [PeerType.RAFT, *encode(AppendEntries(1, 0, 0, [], 1 << 40, 1))], 0.5)
    assert q.heard_leader < 0 and q.leader_commit == 0 and not q.contact(0.5)


def test_an_install_snapshot_whose_table_does_not_decode_is_refused_before_the_core_takes_it() -> None:
    """Review: the core reset its log and asked to persist the garbage, and every later start failed."""
    q, out = quorum("b", ("a", "b", "c"), ["a", "b", "c"], Stored())
    with pytest.raises(PeerProtocolError, match="InstallSnapshot"):
        q.on_raft("a", [PeerType.RAFT, *encode(InstallSnapshot(1, 50, 1, b"\xc1garbage"))], 0.5)
    assert not out and q.raft is not None and q.raft.applied_index == 0


@pytest.mark.parametrize(
    "frame",
    [
        [PeerType.CONTROL],
        [PeerType.CONTROL, 5, 0, 1, 1, [], 0],
        [PeerType.CONTROL, 1, 4, 1, 1, [], 0],
        [PeerType.CONTROL, 1, 0, -1, 1, [], 0],
        [PeerType.CONTROL, 1, 0, 1, 1, ["a"] * 9, 0],
        [PeerType.CONTROL, 1, 0, 1, 1, [""], 0],
        [PeerType.CONTROL, 2, 0, 1, 1, [], 1 << 62],
        [PeerType.CONTROL, 1, 0, 1, 1, "a", 0],
    ],
)
def test_a_malformed_control_frame_is_a_protocol_error(frame: list[Any]) -> None:
    q, _ = quorum("a", ("a",), ["a", "b"], Stored())
    with pytest.raises(PeerProtocolError, match="CONTROL"):
        q.on_control("b", frame, 0.5)


def controlling(replicas: tuple[str, ...]) -> tuple[Quorum, list[Any], float]:
    """A one-voter quorum at ``a``, in contact, whose table has partition 0 led by ``replicas[0]``
    with every replica in sync (3 replicas, min_insync 2)."""
    out: list[Any] = []
    q = Quorum("a", ("a",), ["a", "b", "c"], SETTINGS, 1, 3, random.Random(7), LinkTable(["b", "c"], out), out)
    first = SetPartition(0, 0, replicas[0], 1, replicas, replicas).encode()
    q.started(Stored(2, "a", 0, 0, None, [(2, first)]), 0.0)
    t = run_until(q, out, lambda t: q.raft is not None and q.raft.role == "leader" and q.contact(t))
    assert q.contact(t)
    return q, out, t


def test_declines_name_another_leader_until_all_declined_then_the_longest_log_leads_alone() -> None:
    """Suspect leaders (restarted under fsync = interval) decline in turn, each telling its log's
    end; the controller never names one that declined, even as the preferred replica, and once all
    have declined it names the longest log alone in the ISR (cluster/controller.py ``decline``)."""
    q, out, t = controlling(("b", "c", "a"))
    live = frozenset("abc")
    q.tick(t, ["a", "b", "c"], live)
    lead = q.leadership(0)
    assert lead is not None and (lead.leader, lead.isr) == ("b", ("b", "c", "a"))
    q.on_control("b", [PeerType.CONTROL, 3, 0, 1, lead.version, [], 4], t)  # b: last epoch 1, end 4
    sync_all(q, out, t)
    lead = q.leadership(0)
    assert lead is not None and (lead.leader, lead.epoch, lead.isr) == ("c", 2, ("b", "c", "a"))
    q.tick(t, ["a", "b", "c"], live)  # (b is the preferred replica, in sync and live: but it declined)
    sync_all(q, out, t)
    assert q.leadership(0) == lead
    q.on_control("c", [PeerType.CONTROL, 3, 0, 1, lead.version, [], 9], t)  # c: the longest
    sync_all(q, out, t)
    lead = q.leadership(0)
    assert lead is not None and (lead.leader, lead.isr) == ("a", ("b", "c", "a"))
    q.on_control("a", [PeerType.CONTROL, 3, 0, 1, lead.version, [], 7], t)
    sync_all(q, out, t)
    lead = q.leadership(0)
    assert lead is not None and (lead.leader, lead.epoch, lead.isr) == ("c", 4, ("c",))
    assert 0 not in q.reports  # (one leads alone: the reports are spent)


def test_a_suspect_followers_report_keeps_it_from_the_lead_until_it_says_it_recovered() -> None:
    """A suspect in the ISR reports itself though not named (a controller that did not know would
    name it at the next change, and drop a dead member as if it could lead); the preferred replica
    does not take the lead back while its report stands, and does once it says it caught up."""
    q, out, t = controlling(("b", "c", "a"))
    live = frozenset("abc")
    q.tick(t, ["a", "b", "c"], live)
    lead = q.leadership(0)
    assert lead is not None and lead.leader == "b"
    q.on_control("b", [PeerType.CONTROL, 3, 0, 1, lead.version, [], 4], t)  # (b declines: c leads)
    sync_all(q, out, t)
    lead = q.leadership(0)
    assert lead is not None and lead.leader == "c"
    q.on_control("a", [PeerType.CONTROL, 3, 0, 1, 0, [], 9], t)  # (a follower's report: any version)
    assert q.leadership(0) == lead and set(q.reports[0]) == {"a", "b"}
    q.tick(t, ["a", "b", "c"], live)
    sync_all(q, out, t)
    assert q.leadership(0) == lead  # (b is preferred, but reported)
    q.on_control("b", [PeerType.CONTROL, 4, 0, 0, 0, [], 0], t)  # (b caught up from c)
    assert set(q.reports[0]) == {"a"}
    q.tick(t, ["a", "b", "c"], live)
    sync_all(q, out, t)
    back = q.leadership(0)
    assert back is not None and back.leader == "b"
