"""Budgets that one party must not be able to get around (node/budgets.py, node/admission.py):
records and subscriptions moved between hosts, tombstones, records back from a snapshot, text
addresses whose home moves, refusals that must change nothing. Each test is a way around a
budget that a review found, and what happens now."""

from __future__ import annotations

import random
from typing import Any

from roost.client import clustermap, wire
from roost.client.wire import ErrorCode, FrameType
from roost.cluster.peerwire import check_entries_untrusted
from roost.node import versions
from roost.node.config import NodeConfig
from roost.node.core import BrokerCore
from roost.node.ownership import Ownership
from sim.check import budget_drift
from tests.corekit import PAD, FakeClient, frames_to, make_core, replicated, sends
from tests.test_hardening import _pub_from, _subscribe, clients

T1 = ("127.0.0.1", 6001)
T2 = ("127.0.0.1", 6002)


def member(nid: str, idx: int, **kw: Any) -> BrokerCore:
    return BrokerCore(NodeConfig(id=nid, **kw), random.Random(idx), incarnation=1,
                      members=[["a", "127.0.0.1", 7400], ["b", "127.0.0.1", 7401]], node_idx=idx,
                      wall_offset=1.8e9, replicating=True, tombstone_horizon=600.0)  # fmt: skip


def entries(out: list[Any]) -> list[Any]:
    return check_entries_untrusted(replicated(out))


def errors(out: list[Any], addr: Any) -> list[int]:
    return [f[1] for f in frames_to(out, addr) if f[0] is FrameType.ERROR]


def text_errors(out: list[Any]) -> list[bytes]:
    return [s.data for s in sends(out) if s.data.startswith(b"ERR")]


def test_a_host_at_max_per_host_asking_for_a_producer_takes_no_ones_place():
    core = make_core(max_producers=4, max_per_host=3)
    for fc in clients(core, *[("127.0.0.30", p) for p in range(3)]):
        assert _subscribe(fc, ["park"]) == [ErrorCode.OK]  # the host holds max_per_host records
    a, b = clients(core, ("127.0.0.2", 1), ("127.0.0.3", 1))
    for i in range(3):
        assert _pub_from(a, bytes([i]) * 16, 0.0) == []
    assert _pub_from(b, b"\x50" * 16, 0.0) == []
    (h,) = clients(core, ("127.0.0.30", 99))
    (err,) = _pub_from(h, b"\x77" * 16, 1.0)
    assert err[1] == ErrorCode.OVERLOADED and "max_per_host" in err[2]
    assert core.metrics["producers_evicted"] == 0 and len(core.producers) == 4
    assert core.metrics["refused_max_per_host"] == 1


def _shuffle(core: BrokerCore, n: int, subs: int) -> list[list[int]]:
    """Host A makes ``n`` records of ``subs`` subscriptions each, and each moves to host B by a
    PING with its client id from there: what B's PINGs were answered (ERROR codes)."""
    A, B = "10.0.0.2", "10.0.0.3"
    refused = []
    for i in range(n):
        cid = bytes([i + 1]) * 16
        fa = FakeClient(core, (A, 1000 + i), cid)
        fa.hello()
        assert _subscribe(fa, [f"t{i}.{j}" for j in range(subs)]) == [ErrorCode.OK] * subs
        fb = FakeClient(core, (B, 2000 + i), cid)
        fb.hello()
        refused.append(errors(fb.ping(0.5), fb.addr))
        assert core.clients[cid].counted == (A if refused[-1] else B)  # (a refused move changes nothing)
    assert budget_drift(core) == ""
    return refused


def test_two_hosts_cannot_pass_records_and_subscriptions_between_them_with_pings():
    core = make_core(max_per_host=10, max_subscriptions_per_host=5)
    assert _shuffle(core, 3, 2) == [[], [], [ErrorCode.OVERLOADED]]  # (B would hold 6 subscriptions)
    assert core.budgets.hosts["10.0.0.3"][0] == 4 and core.metrics["refused_max_subscriptions_per_host"] == 1
    core = make_core(max_per_host=2)
    assert _shuffle(core, 3, 1) == [[], [], [ErrorCode.OVERLOADED]]  # (B would hold 3 records)
    assert core.admission.per_host["10.0.0.3"] == 2 and core.metrics["refused_max_per_host"] == 1


def test_a_client_that_lives_at_another_member_now_is_counted_there_not_here():
    a, b = member("a", 0), member("b", 1)
    H = ("10.9.9.9", 4000)
    (at_a,) = clients(a, H)
    assert _subscribe(at_a, ["t.1"]) == [ErrorCode.OK]
    b.merge(at_a.take_pushes(), 1.0)
    at_a.send(wire.encode_bye(at_a.cid, at_a.cookie, at_a.session), 2.0)  # (dropped at a)
    b.merge(at_a.take_pushes(), 2.0)
    at_b = FakeClient(b, H, at_a.cid)
    at_b.hello(3.0)
    at_b.session, at_b.batch = at_a.session + 1, 0
    assert _subscribe(at_b, ["u.1", "u.2"], 3.0) == [ErrorCode.OK, ErrorCode.OK]
    a.merge(at_b.take_pushes(), 4.0)
    assert a.clients[at_a.cid].home == "b"
    assert a.admission.per_host == {} and a.client_share.per_host == {} and a.budgets.hosts == {}
    assert b.budgets.hosts == {"10.9.9.9": [2, 6, 1]}  # (and the tombstone of t.1)
    assert budget_drift(a) == "" and budget_drift(b) == ""


def test_records_back_from_a_snapshot_are_counted_and_charged_to_their_host():
    a = member("a", 0, max_subscriptions_per_host=3)
    H = ("10.9.9.9", 4000)
    (fc,) = clients(a, H)
    assert _subscribe(fc, ["t.0"]) == [ErrorCode.OK]
    snapshot = check_entries_untrusted(list(a.dump()))
    a2 = member("a", 0, max_subscriptions_per_host=3)  # the member, restarted
    a2.merge(snapshot, 10.0)
    assert a2.admission.per_host == {"10.9.9.9": 1} and a2.budgets.hosts == {"10.9.9.9": [1, 3, 0]}
    fc.core = a2
    fc.hello(11.0)
    assert _subscribe(fc, [f"t.{i}" for i in range(1, 5)], 11.0) == [
        ErrorCode.OK,
        ErrorCode.OK,
        ErrorCode.OVERLOADED,
        ErrorCode.OVERLOADED,
    ]
    assert budget_drift(a2) == ""


def test_tombstones_count_against_their_host_until_collected():
    a = member("a", 0, max_tombstones_per_host=30)
    (fc,) = clients(a, ("10.1.1.1", 1))
    for r in range(4):  # SUB then UNSUB of fresh filters: each leaves a tombstone
        fc.cmds([cmd for i in range(10) for cmd in ((1, f"x.{r}.{i}", None, 0), (0, f"x.{r}.{i}", None, 0))],
                1.0 + r)  # fmt: skip
    c = a.clients[fc.cid]
    assert c.live == 0 and len(c.subs) == 30 and a.budgets.hosts == {"10.1.1.1": [0, 0, 30]}
    assert a.budgets.tombstones == 30 and a.metrics["refused_max_tombstones_per_host"] == 10
    assert _subscribe(fc, ["y"], 5.0) == [ErrorCode.OVERLOADED]
    a.collect_tombstones(1000.0)  # (tombstone_horizon 600 s later)
    assert a.budgets.hosts == {} and a.budgets.tombstones == 0
    assert _subscribe(fc, ["y"], 1001.0) == [ErrorCode.OK]
    assert budget_drift(a) == ""


def test_unsubscribing_filters_a_partitioned_home_never_held_is_bounded_too():
    two = {"n1": (("127.0.0.1", 7401), ("127.0.0.1", 7501)), "n2": (("127.0.0.1", 7402), ("127.0.0.1", 7502))}
    core = BrokerCore(NodeConfig(id="n1", client_addr=two["n1"][0], max_tombstones_per_host=100),
                      random.Random(1), incarnation=1, replicating=True, wall_offset=1.8e9,
                      tombstone_horizon=3600.0)  # fmt: skip
    own = Ownership("n1", 16)
    core.set_ownership(own)
    cmap = clustermap.compute(1, two, two, 16, 2)
    core.reindex(*own.update(1, cmap.owners))
    core.set_cluster_map(clustermap.encode(cmap), 1)
    (fc,) = clients(core, ("10.1.1.1", 1))
    for r in range(10):
        fc.cmds([(0, f"y.{r}.{i}", None, 0) for i in range(50)], 1.0)
    c = core.clients[fc.cid]
    assert len(c.subs) == 100 and core.metrics["refused_max_tombstones_per_host"] == 400
    assert budget_drift(core) == ""


def test_text_subscriptions_above_the_share_go_to_a_host_under_it():
    core = make_core(max_text_subscribers=10, admission_share=0.8)
    for p in range(10):
        out = core.handle_datagrams([(b"SUB t\n" + PAD, ("127.0.0.2", 7000 + p))], 0.0)
        assert bool(text_errors(out)) == (p >= 8)  # (one host: at its share from 8 on)
    assert not text_errors(core.handle_datagrams([(b"SUB t\n" + PAD, ("127.0.0.3", 7000))], 0.0))
    assert core.text_subs == 9 and core.metrics["refused_max_text_subscribers"] == 2


def test_text_records_do_not_count_against_max_clients():
    core = make_core(max_clients=10, max_per_host=100)
    for p in range(10):
        assert not text_errors(core.handle_datagrams([(b"SUB t\n" + PAD, ("127.0.0.2", 7000 + p))], 0.0))
    (legit,) = clients(core, ("10.0.0.11", 1))
    assert _subscribe(legit, ["t"]) == [ErrorCode.OK]


def test_a_text_address_whose_home_moves_is_charged_and_leased_at_its_new_home():
    a = member("a", 0, max_subscriptions_per_host=3)
    b = member("b", 1, max_subscriptions_per_host=3)
    a.merge(entries(b.handle_datagrams([(b"SUB t\n" + PAD, T1)], 1.0)), 1.0)
    assert a.clients[T1].charged == ""  # (b's to charge)
    codes = []
    for i in range(4):
        out = a.handle_datagrams([(f"SUB x{i}\n".encode() + PAD, T1)], 2.0 + i)
        codes.append(bool(text_errors(out)))
        b.merge(entries(out), 2.0 + i)
    assert codes == [False, False, True, True]  # (t, x0, x1: the host's 3 here now)
    assert a.clients[T1].home == "a" and a.budgets.hosts == {"127.0.0.1": [3, 5, 0]}
    assert b.budgets.hosts == {} and budget_drift(a) == "" and budget_drift(b) == ""


def test_a_text_subscription_renewed_at_another_member_moves_its_home_and_never_lapses():
    a, b = member("a", 0), member("b", 1)
    lease = a.cfg.text_sub_lease
    b.merge(entries(a.handle_datagrams([(b"SUB t\n" + PAD, T1)], 1.0)), 1.0)  # home a
    t, gaps = 1.0, []
    while t < 3 * lease:  # the client sends its renewals to b from now on
        t += lease / 4
        a.merge(entries(b.handle_datagrams([(b"SUB t\n" + PAD, T1)], t)), t)
        b.merge(entries(a.tick(t + 1)), t + 1)
        a.merge(entries(b.tick(t + 1)), t + 1)
        if not b.clients[T1].subs.get(("t", None), 0) & versions.PRESENT:
            gaps.append(t + 1)
    assert b.clients[T1].home == "b" and gaps == []


def test_refusals_by_the_node_wide_limits_are_counted_under_their_setting():
    core = make_core(max_producers=1, max_per_host=100, max_text_subscribers=1, admission_share=1.0)
    (a,) = clients(core, ("10.0.0.2", 1))
    assert _pub_from(a, b"\x01" * 16, 0.0) == []
    assert _pub_from(a, b"\x02" * 16, 0.0)[0][1] == ErrorCode.OVERLOADED  # (the largest holder: no eviction)
    core.handle_datagrams([(b"SUB t\n" + PAD, T1)], 0.0)
    assert text_errors(core.handle_datagrams([(b"SUB u\n" + PAD, T2)], 0.0))
    assert core.metrics["refused_max_producers"] == 1 and core.metrics["refused_max_text_subscribers"] == 1


# ------------------------------------------------------------ what a legitimate client must still get


def test_a_subscription_that_replaces_a_tombstone_of_its_own_is_not_refused_for_tombstones():
    a = member("a", 0, max_subscriptions_per_host=10, max_tombstones_per_host=10)
    (fc,) = clients(a, ("10.1.1.1", 1))
    assert _subscribe(fc, [f"x.{i}" for i in range(10)], 1.0) == [ErrorCode.OK] * 10
    fc.cmds([(0, f"x.{i}", None, 0) for i in range(10)], 2.0)
    assert a.budgets.hosts["10.1.1.1"] == [0, 0, 10]
    assert _subscribe(fc, ["y"], 3.0) == [ErrorCode.OVERLOADED]
    assert _subscribe(fc, ["x.0"], 3.0) == [ErrorCode.OK]  # (it was a tombstone of its own)
    assert a.budgets.hosts["10.1.1.1"] == [1, 3, 9] and budget_drift(a) == ""


def test_a_client_refused_where_it_moved_is_not_kept_alive_there_and_times_out():
    a = member("a", 0, max_subscriptions_per_host=3)
    A, B = ("10.0.0.2", 1000), ("10.0.0.3", 2000)
    (fa,) = clients(a, A)
    assert _subscribe(fa, ["t.1", "t.2"], 0.0) == [ErrorCode.OK, ErrorCode.OK]
    (other,) = clients(a, ("10.0.0.3", 3000))  # (host B holds 2 already: t.1 and t.2 would pass its 3)
    assert _subscribe(other, ["u.1", "u.2"], 0.0) == [ErrorCode.OK, ErrorCode.OK]
    fb = FakeClient(a, B, fa.cid)  # the same process: its NAT maps it to host B now
    fb.hello(1.0)
    for t in range(1, 10):  # (subscriber_timeout: 10 s)
        assert errors(fb.ping(float(t)), B) == [ErrorCode.OVERLOADED]
        other.ping(float(t))
        a.tick(float(t))
    a.tick(12.0)
    c = a.clients[fa.cid]
    assert not c.local and c.live == 0 and a.metrics["clients_timed_out"] == 1  # (its subscriptions ended)
    (pong,) = [f for f in frames_to(fb.ping(12.5), B) if f[0] is FrameType.PONG]
    assert pong[2] is False  # (known = false: the client learns its subscriptions are gone)
    assert budget_drift(a) == ""


def test_a_process_restarted_on_another_host_brings_only_its_record():
    a = member("a", 0, max_subscriptions_per_host=10)
    A, B = ("10.0.0.2", 1000), ("10.0.0.3", 2000)
    (fa,) = clients(a, A)
    assert _subscribe(fa, [f"t.{i}" for i in range(8)], 0.0) == [ErrorCode.OK] * 8
    (other,) = clients(a, ("10.0.0.3", 3000))
    assert _subscribe(other, [f"u.{i}" for i in range(5)], 0.0) == [ErrorCode.OK] * 5
    fb = FakeClient(a, B, fa.cid)  # (its configured client id, a new process: a higher session)
    fb.hello(1.0)
    fb.session, fb.batch = fa.session + 1, 0
    assert _subscribe(fb, ["t.0"], 1.0) == [ErrorCode.OK]
    assert a.budgets.hosts["10.0.0.3"][0] == 6 and budget_drift(a) == ""
    fa.batch = 100  # (and a late batch of the old process, from its old host, is stale, not refused)
    (ack,) = [f for f in frames_to(fa.cmds([(1, "old", None, 0)], 2.0), A) if f[0] is FrameType.CMDACK]
    assert list(ack[3]) == [ErrorCode.STALE_BATCH]


def test_closed_clients_no_longer_count_against_their_host_records():
    a = member("a", 0, max_per_host=6)
    for gen in range(3):
        for fc in clients(a, *[("10.1.1.1", 10 * gen + i) for i in range(3)]):
            assert _subscribe(fc, ["app"], 10.0 * gen) == [ErrorCode.OK]
            fc.send(wire.encode_bye(fc.cid, fc.cookie, fc.session), 10.0 * gen + 5)
    assert a.admission.per_host == {} and a.client_share.per_host == {}
    assert a.budgets.hosts == {"10.1.1.1": [0, 0, 9]} and budget_drift(a) == ""  # (their tombstones do)


def test_a_text_subscription_renewed_at_each_member_in_turn_never_lapses():
    a, b = member("a", 0), member("b", 1)
    lease = a.cfg.text_sub_lease

    def sub(core: BrokerCore, other: BrokerCore, topic: bytes, t: float) -> None:
        other.merge(entries(core.handle_datagrams([(b"SUB " + topic + b"\n" + PAD, T1)], t)), t)

    sub(a, b, b"t", 1.0)
    sub(a, b, b"u", 1.0)  # (home a: both leased there)
    sub(b, a, b"u", 1.0 + 0.5 * lease)  # (u renewed at b: home b)
    sub(a, b, b"t", 1.0 + 0.6 * lease)  # (t renewed at a: home a again, which must lease u anew)
    t = 1.0 + 0.6 * lease
    while t < 1.0 + 1.45 * lease:  # (u's renewal holds it until 1 + 1.5 x lease)
        t += lease / 20
        b.merge(entries(a.tick(t)), t)
        a.merge(entries(b.tick(t)), t)
        assert a.clients[T1].subs[("u", None)] & versions.PRESENT, t


def test_a_text_address_made_home_here_by_a_merge_is_charged_and_leased():
    a, b = member("a", 0), member("b", 1)
    b.merge(entries(a.handle_datagrams([(b"SUB t\n" + PAD, T1)], 1.0)), 1.0)
    a.merge(entries(b.handle_datagrams([(b"SUB u\n" + PAD, T1)], 2.0)), 2.0)  # (home b)
    snapshot = check_entries_untrusted(list(a.dump()))  # (a's snapshot: home b)
    b.merge(entries(a.handle_datagrams([(b"SUB w\n" + PAD, T1)], 3.0)), 3.0)  # (home a again; a crashes)
    a2 = member("a", 0)
    a2.merge(snapshot, 10.0)
    a2.merge(check_entries_untrusted(list(b.dump())), 10.0)  # (its PULL from b: home a)
    c = a2.clients[T1]
    assert c.home == "a" and c.local and c.charged == "127.0.0.1" and a2.budgets.hosts["127.0.0.1"][0] == 3
    a2.tick(10.0 + 2 * a2.cfg.text_sub_lease)
    assert c.live == 0 and budget_drift(a2) == ""  # (not renewed: they lapse)
