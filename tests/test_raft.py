"""The metadata quorum's Raft core (cluster/raft.py): single cores driven by hand, then cores paired over
tests/raftnet.py's deterministic world (network faults, partitions, crashes that lose unsynced writes,
pauses), then a randomized campaign and the deliberately broken builds it must catch."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roost.cluster.raft import (
    CANDIDATE,
    FOLLOWER,
    LEADER,
    PRECANDIDATE,
    Raft,
    RaftApply,
    RaftPersist,
    RaftRestore,
    RaftRoleChanged,
    RaftSend,
    RaftSettings,
    RaftSnapshotWanted,
    Stored,
)
from roost.cluster.raftwire import (
    MAX_COMMAND_BYTES,
    MAX_INDEX,
    AppendEntries,
    AppendReply,
    InstallSnapshot,
    RaftFormatError,
    RequestVote,
    SnapshotReply,
    VoteReply,
    decode_untrusted_raft,
    encode,
)
from sim.raftdisk import RaftState
from tests.raftnet import CAMPAIGN, Disk, Net, campaign

ABC = ("a", "b", "c")


EMPTY = Stored()


def make(me: str = "b", voters: tuple[str, ...] = ABC, learners: tuple[str, ...] = (), stored: Stored = EMPTY,
         now: float = 0.0, breaks: frozenset[str] = frozenset(), **overrides: Any) -> Raft:  # fmt: skip
    return Raft(me, voters, learners, RaftSettings(**overrides), random.Random(1), stored, now, breaks)


def sends(actions: list[Any]) -> list[RaftSend]:
    return [a for a in actions if isinstance(a, RaftSend)]


def persists(actions: list[Any]) -> list[RaftPersist]:
    return [a for a in actions if isinstance(a, RaftPersist)]


def answered(core: Raft, actions: list[Any], now: float) -> list[RaftSend]:
    """What ``actions`` send, with what leaves once their persist is synced."""
    out = sends(actions)
    for p in persists(actions):
        out += sends(core.persisted(p.token, now))
    return out


def elect(net: Net, seconds: float = 5.0) -> Raft:
    net.run_for(seconds)
    leader = net.leader()
    assert leader is not None, [(c.me, c.role, c.term) for c in net.live()]
    return leader


# -- one core by hand ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("broken", [False, True])
def test_a_follower_answers_an_append_only_once_it_is_persisted(broken):
    f = make(breaks=frozenset({"raft-no-persist-wait"}) if broken else frozenset())
    actions = f.receive("a", AppendEntries(1, 0, 0, [(1, b"x")], 0, 7), 0.5)
    (p,) = persists(actions)
    assert (p.term, p.entries) == (1, [(1, 1, b"x")])
    reply = RaftSend("a", AppendReply(1, True, 1, 0, 7))
    if broken:  # the break shows what the rule forbids
        assert sends(actions) == [reply]
        return
    assert sends(actions) == []
    assert sends(f.persisted(p.token, 0.6)) == [reply]


def test_a_vote_leaves_only_once_it_is_persisted():
    f = make()
    assert f.receive("c", RequestVote(1, 0, 0, False), 0.5) == []  # just started: it may have heard a leader
    actions = f.receive("c", RequestVote(1, 0, 0, False), 1.5)
    (p,) = persists(actions)
    assert (p.term, p.vote, sends(actions)) == (1, "c", [])
    assert sends(f.persisted(p.token, 1.6)) == [RaftSend("c", VoteReply(1, True, False))]
    assert sends(f.receive("a", RequestVote(1, 0, 0, False), 1.7)) == [RaftSend("a", VoteReply(1, False, False))]


def test_a_candidate_asks_only_once_its_own_vote_is_persisted_and_a_leader_counts_its_entry_once_synced():
    a = make("a")
    actions = a.tick(a.next_deadline())
    assert a.role == PRECANDIDATE and a.term == 0 and persists(actions) == []  # PreVote: the term is not raised
    assert {s.to: s.msg for s in sends(actions)} == {v: RequestVote(1, 0, 0, True) for v in "bc"}
    actions = a.receive("b", VoteReply(1, True, True), a.next_deadline() - 1.0)
    (p,) = persists(actions)
    assert (a.role, a.term, p.vote, sends(actions)) == (CANDIDATE, 1, "a", [])
    now = a.next_deadline() - 1.0
    asks = sends(a.persisted(p.token, now))
    assert {s.to: s.msg for s in asks} == {v: RequestVote(1, 0, 0, False) for v in "bc"}
    actions = a.receive("c", VoteReply(1, True, False), now)
    assert a.role == LEADER and RaftRoleChanged(LEADER, 1, "a") in actions
    (noop,) = persists(actions)
    assert noop.entries == [(1, 1, b"")]
    a.receive("c", AppendReply(1, True, 1, 0, 1), now)
    assert a.commit_index == 0  # c has it, but our own copy is not synced: no majority yet
    assert RaftApply(1, b"") in a.persisted(noop.token, now)
    assert a.commit_index == 1


def test_a_single_voter_commits_a_proposal_once_synced_and_refuses_what_is_too_long():
    a = make("a", voters=("a",), learners=("l",))
    actions = a.tick(a.next_deadline())
    (p,) = persists(actions)
    actions = a.persisted(p.token, 1.5)
    (noop,) = persists(actions)
    a.persisted(noop.token, 1.5)
    index, actions = a.propose(b"x", 1.6)
    assert index == 2 and a.commit_index == 1
    assert [s.msg.entries for s in sends(actions)] == [[(1, b"x")]]  # the learner gets it
    assert RaftApply(2, b"x") in a.persisted(persists(actions)[0].token, 1.7)
    assert a.propose(b"x" * (MAX_COMMAND_BYTES + 1), 1.8)[0] is None


def test_a_leader_commits_an_earlier_terms_entry_only_with_one_of_its_own():
    """Figure 8 of the paper: the leader of term 4 holds an entry of term 2 it did not commit then."""
    stored = Stored(3, None, 0, 0, None, [(1, b"x"), (2, b"a2")])
    for breaks, committed in ((frozenset(), 0), (frozenset({"raft-count-old-term"}), 2)):
        a = make("a", stored=stored, breaks=breaks)
        a.tick(a.next_deadline())
        now = a.next_deadline() - 1.0
        (p,) = persists(a.receive("b", VoteReply(4, True, True), now))
        a.persisted(p.token, now)
        (noop,) = persists(a.receive("b", VoteReply(4, True, False), now))
        a.persisted(noop.token, now)
        assert a.role == LEADER and a.log.last_index == 3
        a.receive("b", AppendReply(4, True, 2, 0, 0), now)  # b holds up to the term-2 entry, not the no-op
        assert a.commit_index == committed
        if not breaks:
            a.receive("b", AppendReply(4, True, 3, 0, 0), now)
            assert a.commit_index == 3


def test_a_refusal_hints_where_to_retry_a_term_at_a_time():
    f = make(stored=Stored(2, None, 0, 0, None, [(1, b""), (1, b""), (2, b""), (2, b""), (2, b"")]))
    assert answered(f, f.receive("a", AppendEntries(5, 5, 3, [], 0, 9), 1.0), 1.0)[0].msg == AppendReply(
        5, False, 0, 3, 9
    )
    assert sends(f.receive("a", AppendEntries(5, 8, 3, [], 0, 10), 1.0))[0].msg == AppendReply(5, False, 0, 6, 10)
    # the leader's side: a refusal moves next to the hint at once, never below what is matched
    a = make("a", voters=("a", "b"), stored=Stored(3, None, 0, 0, None, [(1, b"")] * 6))
    a.tick(a.next_deadline())
    answered(a, a.receive("b", VoteReply(4, True, True), 1.5), 1.5)
    a.receive("b", VoteReply(4, True, False), 1.5)
    assert a.role == LEADER
    (retry,) = sends(a.receive("b", AppendReply(4, False, 0, 3, 1), 1.6))
    assert (retry.msg.prev_index, len(retry.msg.entries)) == (2, 5)


def test_learners_never_vote_nor_campaign_and_strangers_are_ignored():
    learner = make("l", learners=("l",))
    assert learner.next_deadline() == float("inf")
    assert learner.receive("a", RequestVote(1, 0, 0, False), 5.0) == []
    b = make()
    assert b.receive("l", RequestVote(1, 0, 0, False), 5.0) == []  # not a voter: no vote for it
    assert b.receive("x", AppendEntries(1, 0, 0, [], 0, 1), 5.0) == []  # nobody we know
    assert b.term == 0


def test_the_acknowledgements_of_learners_never_count():
    net = Net(11, voters=3, learners=2)
    leader = elect(net)
    for n in net.voters:
        if n != leader.me:
            net.crash(n)
    index = net.propose(leader.me, b"alone")  # its lease still runs
    assert index is not None
    net.run_for(0.5)
    assert all(net.cores[n].log.last_index == index for n in net.learners)  # type: ignore[union-attr]
    assert leader.commit_index < index and net.propose(leader.me, b"later") is not None
    net.run_for(1.0)
    assert leader.role == FOLLOWER and b"alone" not in net.committed.values()  # CheckQuorum stepped it down


def test_learners_joining_and_leaving_are_sent_to_and_forgotten():
    a = make("a", voters=("a",))
    (p,) = persists(a.tick(a.next_deadline()))
    (noop,) = persists(a.persisted(p.token, 1.5))
    a.persisted(noop.token, 1.5)
    actions = a.set_learners(("l1", "l2"), 1.6)
    assert {s.to: s.msg.entries for s in sends(actions)} == {"l1": [], "l2": []}  # from the end; they catch up
    assert sends(a.receive("l1", AppendReply(1, False, 0, 1, 0), 1.7))[0].msg.entries == [(1, b"")]
    a.set_learners(("l2",), 1.8)
    assert {s.to for s in sends(a.tick(a.next_deadline()))} == {"l2"}
    assert a.receive("l1", AppendReply(1, True, 1, 0, 0), 1.9) == []  # a stranger now


def test_a_stored_snapshot_is_restored_from_the_first_event():
    stored = Stored(2, "a", 5, 2, b"S", [(2, b"y")])
    f = make(stored=stored, now=10.0)
    assert f.next_deadline() == 10.0
    assert f.tick(10.0)[0] == RaftRestore(5, b"S")
    assert (f.applied_index, f.commit_index, f.last_index) == (5, 5, 6)
    actions = f.receive("a", AppendEntries(2, 6, 2, [], 6, 3), 10.5)
    assert RaftApply(6, b"y") in actions


def test_an_install_snapshot_replaces_a_conflicting_log():
    f = make(stored=Stored(1, None, 0, 0, None, [(1, b"old")]))
    actions = f.receive("a", InstallSnapshot(3, 9, 2, b"S"), 1.0)
    assert RaftRestore(9, b"S") in actions
    (p,) = persists(actions)
    assert (p.truncate_after, p.snapshot) == (9, (9, 2, b"S"))  # (installed, then every entry after it cut)
    disk = RaftState(1, None, None, [(1, b"old")])
    disk.apply(p, "the store's rules")  # (cluster/raftstore.py: snapshot first, then the cut)
    assert (disk.snapshot_index, disk.entries) == (9, [])
    assert sends(f.persisted(p.token, 1.1)) == [RaftSend("a", SnapshotReply(3, 9))]
    assert (f.applied_index, f.last_index, f.log.term_at(9)) == (9, 9, 2)


@pytest.mark.parametrize("bad", [{"heartbeat_interval": 1.0}, {"heartbeat_interval": 0.0}, {"max_append_entries": 0},
                                 {"max_command_bytes": MAX_COMMAND_BYTES + 1}])  # fmt: skip
def test_settings_that_cannot_work_are_refused(bad):
    with pytest.raises(ValueError):
        RaftSettings(**bad)


# -- the wire -----------------------------------------------------------------------------------------------

MESSAGES = [
    RequestVote(3, 10, 2, True),
    VoteReply(0, False, False),
    AppendEntries(5, 9, 4, [(4, b"a"), (5, b"")], 8, 77),
    AppendEntries(1, 0, 0, [], 0, 1),
    AppendReply(5, False, 0, 3, 12),
    InstallSnapshot(5, 100, 4, b"state"),
    SnapshotReply(5, 100),
]


@pytest.mark.parametrize("msg", MESSAGES)
def test_every_message_survives_the_wire(msg):
    assert decode_untrusted_raft(msgpack.unpackb(msgpack.packb(encode(msg)))) == msg


MALFORMED = [
    None, 3, b"x", "x", [], [0], [7], [True, 1, 0, 0, False], [1.0, 1, 0, 0, False], {1: 2},
    [1, 0, 0, 0, False],  # a candidate's term is at least 1
    [1, 1, 0, 1, False],  # index 0 has term 0
    [1, 1, 3, 0, False],  # and an entry has a term
    [1, 1, 1, 2, False],  # a last term above the candidate's own
    [1, 1, 1, 1, 1],  # prevote not a boolean
    [1, 1, 1, 1],  # a field missing
    [1, 1 << 63, 1, 1, False],  # a term out of range
    [2, -1, True, False], [2, 1, 1, False], [2, 1, True],
    [3, 1, 0, 0, "no", 0, 0], [3, 1, 0, 0, [[1]], 0, 0], [3, 1, 0, 0, [1], 0, 0],
    [3, 1, 0, 0, [[2, b"x"]], 0, 0],  # an entry's term above the message's
    [3, 2, 0, 0, [[2, b""], [1, b""]], 0, 0],  # falling terms
    [3, 2, 1, 2, [[1, b""]], 0, 0],  # an entry's term below the previous entry's
    [3, 1, 0, 0, [[1, "str"]], 0, 0],
    [3, 1, 0, 0, [[1, b"x" * (MAX_COMMAND_BYTES + 1)]], 0, 0],
    [3, 1, MAX_INDEX, 1, [[1, b""]], 0, 0],  # past the largest index
    [3, 1, MAX_INDEX + 1, 1, [], 0, 0],
    [3, 1, 5, 1, [], 1.5, 0], [3, 1, 5, 1, [], 0, -1], [3, 1, 0, 0, [], 0, 0, 9],
    [4, 1, True, 0, 0, -1], [4, 1, 1, 0, 0], [4, 1, None, 0, 0, 0],
    [5, 1, 0, 0, b""],  # a snapshot of nothing
    [5, 1, 1, 2, b""],  # its term above the message's
    [5, 1, 1, 1, "data"], [5, 1, 1, 1, b"", b""],
    [6, 1], [6, 1, 2, 3], [6, 1, -2],
]  # fmt: skip


@pytest.mark.parametrize("obj", MALFORMED)
def test_decode_untrusted_raft_refuses_every_malformed_shape(obj):
    with pytest.raises(RaftFormatError):
        decode_untrusted_raft(obj)


_leaf = st.one_of(st.integers(-3, 1 << 64), st.booleans(), st.binary(max_size=8), st.text(max_size=3),
                  st.none(), st.floats(allow_nan=False))  # fmt: skip
_tree = st.recursive(_leaf, lambda kids: st.lists(kids, max_size=8), max_leaves=24)


@settings(max_examples=400, deadline=None)
@given(st.one_of(_tree, st.tuples(st.integers(0, 7), st.lists(_tree, max_size=7)).map(lambda t: [t[0], *t[1]])))
def test_decode_untrusted_raft_only_ever_raises_raft_format_error(obj):
    try:
        msg = decode_untrusted_raft(obj)
    except RaftFormatError:
        return
    assert decode_untrusted_raft(encode(msg)) == msg


# -- cores over the deterministic network -------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_one_leader_per_term_and_learners_never_campaign(seed):
    net = Net(seed, voters=5, learners=2, drop=0.1, dup=0.1, delay=(0.001, 0.05))
    for round_ in range(4):
        elect(net)
        net.crash(net.leader().me)  # type: ignore[union-attr]
        net.run_for(0.5)
        if round_ % 2:
            net.restart_all()
    leaders = [c.me for c in net.live() if c.role == LEADER]
    assert len(leaders) <= 1
    assert net.violations == []
    assert {n for _, n, role, _ in net.roles if role != FOLLOWER} <= set(net.voters)
    assert len({t for _, _, role, t in net.roles if role == LEADER}) >= 4


def test_a_leader_emerges_within_a_few_election_timeouts_after_a_heal():
    net = Net(3, voters=5, learners=1)
    elect(net)
    net.partition(*[[n] for n in net.ids])
    net.run_for(6.0)
    assert net.leader() is None and all(c.role != LEADER for c in net.live())
    terms = {c.me: c.term for c in net.live()}
    net.heal()
    elect(net, 4 * CAMPAIGN.election_timeout)
    assert max(terms.values()) <= 2  # PreVote: six seconds alone raised nobody's term
    assert net.violations == []


def test_prevote_and_stickiness_keep_a_returning_member_from_deposing_the_leader():
    net = Net(4, voters=3, learners=1)
    leader = elect(net)
    term = leader.term
    follower = next(n for n in net.voters if n != leader.me)
    net.partition([follower], [n for n in net.ids if n != follower])
    net.run_for(10.0)
    assert net.cores[follower].term == term  # type: ignore[union-attr]
    assert any(n == follower and role == PRECANDIDATE for _, n, role, _ in net.roles)  # it did try
    net.heal()
    net.run_for(3.0)
    assert net.leader() is leader and leader.term == term
    assert all(c.term == term for c in net.live())
    net.cuts = {frozenset((leader.me, follower))}  # it hears no leader, but the others, who do, hear it
    net.run_for(6.0)
    assert net.cores[follower].role == PRECANDIDATE  # type: ignore[union-attr]  # refused: the others are sticky
    assert net.leader() is leader and all(c.term == term for c in net.live())
    assert net.violations == []


def test_conflicting_histories_end_in_one_log():
    terms = {
        "v0": [1, 1, 2, 2, 2],
        "v1": [1, 1, 3, 3],
        "v2": [1, 1, 2, 4, 4, 4],
        "v3": [1],
        "v4": [1, 1, 2, 2, 2, 2, 2],
    }
    disks = {}
    for n, ts in terms.items():
        disks[n] = Disk(4, [(t, b"%d@%d" % (i, t)) for i, t in enumerate(ts)])
    net = Net(12, voters=5, learners=1, disks=disks, drop=0.05)
    leader = elect(net)
    assert leader.me in ("v2", "v1")  # only a log with a term-3 or term-4 entry can win a majority
    net.propose(leader.me, b"new")
    net.run_for(2.0)
    logs = {tuple(c.log.entries) for c in net.live()}
    assert len(logs) == 1 and net.log_matching() == [] and net.violations == []
    assert leader.commit_index == leader.last_index and b"new" in net.committed.values()


def test_a_leader_cut_off_mid_commit_loses_only_what_was_not_committed():
    net = Net(5, voters=5, learners=1)
    leader = elect(net)
    for i in range(5):
        assert net.propose(leader.me, b"before%d" % i) is not None
    net.run_for(0.5)
    committed = dict(net.committed)
    buddy = next(n for n in net.voters if n != leader.me)
    net.partition([leader.me, buddy], [n for n in net.ids if n not in (leader.me, buddy)])
    cut_off = [net.propose(leader.me, b"cut%d" % i) for i in range(3)]
    assert all(i is not None for i in cut_off)
    net.run_for(0.3)
    assert net.cores[buddy].log.last_index == cut_off[-1]  # type: ignore[union-attr]  # it got them
    net.run_for(4.0)
    new = net.leader()
    assert new is not None and new.me not in (leader.me, buddy)
    for i in range(3):
        net.propose(new.me, b"after%d" % i)
    net.heal()
    net.run_for(3.0)
    assert net.violations == [] and net.log_matching() == []
    applied = {c for _, c in net.applied_log[leader.me]}
    assert not any(c.startswith(b"cut") for c in net.committed.values())
    assert {b"after0", b"after1", b"after2"} <= applied
    assert all(net.committed[i] == c for i, c in committed.items())
    assert len({(h.applied, h.digest) for h in net.hosts.values()}) == 1


def test_the_minority_never_commits_and_its_lease_lapses_before_another_leader_is_elected():
    net = Net(6, voters=5, learners=1, drop=0.05)
    leader = elect(net)
    net.propose(leader.me, b"x")
    net.run_for(0.5)
    commit = leader.commit_index
    minority = [leader.me, next(n for n in net.voters if n != leader.me)]
    net.partition(minority, [n for n in net.ids if n not in minority])
    start = net.now
    accepted = []
    while net.now < start + 4.0:
        accepted.append((net.now, net.propose(leader.me, b"m%.3f" % net.now)))
        net.run_for(0.01)
    assert leader.commit_index == commit  # the minority commits nothing
    last_yes = max(t for t, i in accepted if i is not None)
    assert all(i is None for t, i in accepted if t > last_yes)
    assert last_yes < start + CAMPAIGN.election_timeout
    other = next(t for t, n, role, term in net.roles if role == LEADER and n != leader.me and t > start)
    assert last_yes < other  # its lease ended before another leader began
    assert net.violations == []  # the harness checked no two leases at once, at every event


def test_a_member_restarting_with_an_older_log_catches_up():
    net = Net(7, voters=3, learners=1, drop=0.02)
    leader = elect(net)
    lagging = next(n for n in net.voters if n != leader.me)
    net.crash(lagging)
    for i in range(150):
        net.propose(leader.me, b"p%d" % i)
        net.run_for(0.01)
    net.restart(lagging)
    net.run_for(3.0)
    assert net.hosts[lagging].applied == leader.commit_index >= 150
    assert net.violations == [] and net.log_matching() == []
    assert net.restores == []  # the log was still there: no snapshot needed


def test_a_disk_that_loses_unsynced_writes_again_and_again():
    net = Net(8, voters=3, learners=1, sync=(0.005, 0.03))
    rng = random.Random(8)
    elect(net)
    for step in range(600):
        leader = net.leader()
        if leader is not None:
            net.propose(leader.me, b"d%d" % step)
        busy = [n for n in net.ids if net.pending[n] and net.cores[n] is not None]
        if busy and rng.random() < 0.1:
            victim = rng.choice(busy)
            net.crash(victim)
            net.push(net.now + rng.uniform(0.01, 0.3), "call", victim, lambda v=victim: net.restart(v))
        net.run_for(0.01)
    assert net.persists_lost > 20
    net.calm = True
    net.restart_all()
    net.run_for(4.0)
    assert net.violations == [] and net.log_matching() == []
    assert len({(h.applied, h.digest) for h in net.hosts.values()}) == 1
    assert net.max_committed > 50


@pytest.mark.parametrize("who", ["voter", "learner"])
def test_snapshots_and_install_snapshot_to_a_lagging_member(who):
    settings_ = RaftSettings(snapshot_entries=20, max_append_entries=16)
    net = Net(9, voters=3, learners=1, settings=settings_)
    leader = elect(net)
    lagging = "l0" if who == "learner" else next(n for n in net.voters if n != leader.me)
    net.crash(lagging)
    for i in range(120):
        net.propose(leader.me, b"s%d" % i)
        net.run_for(0.01)
    net.run_for(0.5)
    assert leader.log.base > 60  # compacted
    net.restart(lagging)
    net.run_for(2.0)
    assert [n for n, _ in net.restores] == [lagging]  # it got the snapshot
    assert net.hosts[lagging].applied == leader.commit_index
    assert net.violations == [] and net.log_matching() == []
    net.crash(lagging)  # it restarts from its stored snapshot
    net.restart(lagging)
    net.run_for(2.0)
    assert net.restores[-1][0] == lagging and net.hosts[lagging].applied == leader.commit_index
    assert len({(h.applied, h.digest) for h in net.hosts.values()}) == 1


def test_a_snapshot_is_wanted_every_snapshot_entries():
    a = make("a", voters=("a",), snapshot_entries=3)
    p = persists(a.tick(a.next_deadline()))[0]
    a.persisted(persists(a.persisted(p.token, 1.5))[0].token, 1.5)
    wanted = []
    for i in range(7):
        _, actions = a.propose(b"%d" % i, 2.0)
        wanted += [w.index for w in a.persisted(persists(actions)[0].token, 2.0) if isinstance(w, RaftSnapshotWanted)]
    assert wanted == [3, 6]
    (p,) = persists(a.snapshot_taken(6, b"S", 2.0))
    assert p.snapshot == (6, 1, b"S") and a.log.base == 6


def test_figure_8_is_caught_by_the_checker_only_when_the_rule_is_broken():
    """Three voters in the paper's figure 8: a leads term 4 holding an uncommitted term-2 entry; c holds a
    term-3 entry at the same index. Crash a as soon as it commits index 2 or b has its no-op; then c and b."""
    stores = {"v0": [(1, b"x"), (2, b"a2")], "v1": [(1, b"x")], "v2": [(1, b"x"), (3, b"c2")]}
    for breaks in (frozenset(), frozenset({"raft-count-old-term"})):
        disks = {}
        for n, entries in stores.items():
            disks[n] = Disk(3, list(entries))
        net = Net(10, voters=3, learners=0, settings=RaftSettings(max_append_entries=1), breaks=breaks, disks=disks)
        net.partition(["v0", "v1"], ["v2"])
        a, b = net.cores["v0"], net.cores["v1"]
        while not (a.commit_index >= 2 or b.log.last_index >= 3):  # type: ignore[union-attr]
            net.run_for(0.001)
        net.crash("v0")
        net.partition(["v1", "v2"], ["v0"])
        net.run_for(5.0)
        assert bool(net.violations) == bool(breaks), net.violations


# -- the campaign -------------------------------------------------------------------------------------------

SEEDS = 200


def test_the_campaign_finds_no_violation():
    failed = {}
    accepted = 0
    for seed in range(SEEDS):
        net = campaign(seed)
        accepted += net.accepted
        if net.violations:
            failed[seed] = net.violations[:3]
    assert failed == {}
    assert accepted > SEEDS * 300  # a few hundred proposals per seed


@pytest.mark.parametrize("broken", ["raft-no-persist-wait", "raft-count-old-term"])
def test_the_campaign_catches_a_broken_rule(broken):
    caught = next((seed for seed in range(SEEDS) if campaign(seed, frozenset({broken})).violations), None)
    assert caught is not None


def test_a_snapshot_reply_past_the_leaders_log_moves_nothing() -> None:
    """Review: a SnapshotReply's index was taken as the peer's match, never capped at our log: one
    with a huge index committed what only the leader held, and the next heartbeat's assertion
    killed the member."""
    net = Net(3, voters=3, learners=0)
    leader = elect(net)
    peer = next(c.me for c in net.live() if c is not leader)
    commit = leader.commit_index
    leader.receive(peer, SnapshotReply(leader.term, (1 << 62) - 1), net.now)
    assert leader.commit_index == commit
    leader.tick(net.now + 1.0)  # (a heartbeat to that peer: no assertion fails)
    assert leader.commit_index == commit
