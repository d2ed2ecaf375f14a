"""Partitioned mode's sans-IO pieces, directly: ownership, forwarding queues, push numbering,
peer frame validation, and a member core in the simulator (held CMDACKs, bad FORWARD frames)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from client import wire
from client.wire import E, T
from cluster import clustermap, ring
from cluster.events import Close, Datagrams, LinkBytes, Log, Send
from cluster.forwarding import ForwardQueue
from cluster.peerwire import P, PeerProtocolError, check_forwarded, check_partitions, check_relay, encode
from cluster.replication import PeerQueue
from cluster.sim import Simulation
from node.core import Forward
from node.ownership import Ownership, partition_of
from tests.corekit import connect, frames_to, make_core, sends

PID = b"p" * 16


def test_partition_of_is_the_rings_and_pinned():
    assert ring.partition_of is partition_of
    assert [partition_of(t, 256) for t in ("orders", "prices", "", "é")] == [137, 76, 0, 135]


def test_ownership_update_reports_what_moved_and_routes_by_primary():
    own = Ownership("b", 4)
    gained, lost = own.update(1, [("a", "b"), ("b", "c"), ("c", "a"), ()])
    assert (gained, lost) == ({0, 1}, set())
    topic_of = {partition_of(f"t{i}", 4): f"t{i}" for i in range(50)}
    assert own.forward_to(topic_of[0]) == "a" and own.forward_to(topic_of[1]) is None
    assert own.forward_to(topic_of[3]) is None  # no live owner: nowhere to forward (delivered to no one)
    assert own.owns(topic_of[0]) and not own.owns(topic_of[2])
    gained, lost = own.update(2, [("b",), ("c",), ("c", "b"), ("b",)])
    assert (gained, lost) == ({2, 3}, {1}) and own.epoch == 2


def test_forward_queue_windows_requeues_in_order_and_bounds_memory():
    q = ForwardQueue(max_queue=5, chunk=2, window=2)
    q.add([[f"m{i}"] for i in range(7)])
    assert q.dropped == 2 and len(q) == 5
    f1, f2 = q.next_frame(), q.next_frame()
    assert f1 is not None and f2 is not None and q.next_frame() is None  # window of 2
    q.acked(f1[0])
    q.disconnected()  # f2 was in flight: back in front, in order
    assert [m[0] for m in q.pending] == ["m2", "m3", "m4"]
    f3 = q.next_frame()
    assert f3 is not None
    assert [m[0] for m in q.take(everything=False)] == ["m4"]
    assert [m[0] for m in q.take(everything=True)] == ["m2", "m3"] and len(q) == 0


def test_peer_queue_numbers_entries_and_acknowledges_through_the_last_push():
    q = PeerQueue(max_queue=1000, chunk=2, window=8)
    q.add([[b"a", 0, "h", 1, "n", [["t", None, 1]], 0]] * 3)
    assert q.added == 3 and q.acked_through == 0
    s1, s2 = q.next_push(), q.next_push()
    assert s1 is not None and s2 is not None
    q.acked(s1[0])
    assert q.acked_through == 2
    q.acked(s2[0])  # (one link acknowledges in order)
    assert q.acked_through == 3
    q.add([[b"b", 0, "h", 1, "n", [["t", None, 1]], 0]])
    s3 = q.next_push()
    assert s3 is not None
    q.disconnected()  # in flight again: renumbered from where acknowledgement stopped
    s4 = q.next_push()
    assert s4 is not None
    q.acked(s4[0])
    assert q.acked_through == 4 == q.added


@pytest.mark.parametrize("msgs", [
    "x", [["t", None, None, b"p", PID, 1]], [["bad topic\n", None, None, b"p", None, None, 0]],
    [["t", None, None, "str", None, None, 0]], [["t", None, None, b"p", None, 5, 0]],
    [["t", None, None, b"p", b"short", 1, 0]], [["t", None, None, b"p", PID, 0, 0]],
    [["t", None, None, b"p", PID, 1, 9]], [["t", None, {"k": 1}, b"p", PID, 1, 0]],
])  # fmt: skip
def test_malformed_forwarded_messages_are_refused(msgs):
    with pytest.raises(PeerProtocolError):
        check_forwarded(msgs)


def test_well_formed_forwards_relays_and_partitions_pass():
    ok = [["t", "k", {"a": "b"}, b"p", PID, 7, 1], ["t", None, None, b"", None, None, 0]]
    assert check_forwarded(ok) == ok
    assert check_relay([["127.0.0.1", 9, b"MSG t\nx"]]) == [(("127.0.0.1", 9), b"MSG t\nx")]
    assert check_partitions([0, 3], 4) == {0, 3}
    for bad in ([["localhost", 9, b"x"]], [["127.0.0.1", 0, b"x"]], "x", [["127.0.0.1", 9, "x"]]):
        with pytest.raises(PeerProtocolError):
            check_relay(bad)
    for bad_parts in ([4], [-1], ["0"], "x"):
        with pytest.raises(PeerProtocolError):
            check_partitions(bad_parts, 4)


def _ready_sim() -> Simulation:
    sim = Simulation(3, members=3, clients=2, faults=(), fault_time=2.0, quiet=1.0, mode="partitioned")
    assert sim.run_until(3.0)
    return sim


def test_a_malformed_forward_closes_the_link_and_changes_nothing():
    sim = _ready_sim()
    core = sim.members["m0"].core
    assert core is not None
    inbound = next(x.id for x in core.links.values() if not x.outbound and x.peer == "m1")
    before = core.broker.state_digest()
    out = core.handle(LinkBytes(inbound, encode([P.FORWARD, 1, [["t", None, None, "not bytes", None, None, 0]]])),
                      sim.now)  # fmt: skip
    assert any(isinstance(a, Close) and a.link == inbound for a in out)
    assert any(isinstance(a, Log) and a.event == "peer_protocol_error" for a in out)
    assert core.broker.state_digest() == before


def test_a_cmdack_waits_for_the_owners_and_a_forward_is_delivered_by_the_primary():
    sim = _ready_sim()
    core = sim.members["m0"].core
    assert core is not None
    topic = next(f"w{i}" for i in range(500) if core.cmap.owners[core.own.partition(f"w{i}")][0] != "m0")
    cid, addr = b"c" * 16, ("127.0.0.2", 5000)
    cookie = core.broker.cookies.issue(addr, cid, sim.now + core.wall_offset)
    cmds = wire.encode_cmds(cid, cookie, 1, 1, [(wire.Op.SUB, topic, None, wire.Mode.RELIABLE)])
    out = core.handle(Datagrams([(cmds, addr)]), sim.now)
    to_client = [wire.decode_untrusted_frame(a.data)[0] for a in out if isinstance(a, Send) and a.addr == addr]
    assert to_client == [wire.T.REDIRECT]  # no CMDACK yet: held, the owners have not acknowledged
    assert core.held
    owners = [m for m in core.cmap.owners[core.own.partition(topic)] if m != "m0"]
    for peer in owners:  # the owners acknowledge our push
        lid = core.out[peer]
        assert lid is not None
        q = core.queues[peer]
        for seq in list(q.inflight):
            out = core.handle(LinkBytes(lid, encode([P.PUSHACK, seq])), sim.now)
    assert any(isinstance(a, Send) and a.addr == addr for a in out) and not core.held  # the CMDACK


def test_a_heartbeat_with_an_epoch_out_of_range_closes_the_link():
    """An epoch near 2**64 would overflow msgpack at our next map change (review finding)."""
    sim = _ready_sim()
    core = sim.members["m0"].core
    assert core is not None
    inbound = next(x.id for x in core.links.values() if not x.outbound and x.peer == "m1")
    out = core.handle(LinkBytes(inbound, encode([P.HEARTBEAT, "ready", 0, 0, 2**64 - 1])), sim.now)
    assert any(isinstance(a, Close) and a.link == inbound for a in out)
    assert core.epoch_seen < 2**62


# ------------------------------------------------------------ the map for clients: WELCOME, MAP, REDIRECT

TWO = {"n1": (("127.0.0.1", 7401), ("127.0.0.1", 7501)), "n2": (("127.0.0.1", 7402), ("127.0.0.1", 7502))}


def _member_core(members: dict = TWO, partitions: int = 16) -> tuple[Any, clustermap.ClusterMap]:
    """A broker core as a member of a partitioned cluster runs it, with the map of epoch 1."""
    core = make_core(id="n1", client_addr=TWO["n1"][0])
    own = Ownership("n1", partitions)
    core.set_ownership(own)
    cmap = clustermap.compute(1, members, members, partitions, 2)
    core.reindex(*own.update(1, cmap.owners))
    core.set_cluster_map(clustermap.encode(cmap), 1)
    return core, cmap


def _topic(cmap: clustermap.ClusterMap, primary: str, prefix: str = "t") -> str:
    return next(f"{prefix}{i}" for i in range(1000) if cmap.primary(f"{prefix}{i}") == primary)


def test_a_welcome_carries_the_map_and_a_plain_node_has_none():
    core, cmap = _member_core()
    (c,) = connect(core, ("127.0.0.9", 5000))
    (f,) = frames_to(core.handle_datagrams([(wire.encode_hello(c.cid), c.addr)], 0.0), c.addr)
    assert f[0] is T.WELCOME and f[5] == cmap and f[3]["map_epoch"] == 1
    plain = make_core()
    (f,) = frames_to(plain.handle_datagrams([(wire.encode_hello(c.cid), c.addr)], 0.0), c.addr)
    assert f[5] is None and "map_epoch" not in f[3]
    (pc,) = connect(plain, ("127.0.0.9", 5001))
    (err,) = frames_to(pc.send(wire.encode_map_request(pc.cid, pc.cookie), 0.0), pc.addr)
    assert err[0] is T.ERROR and err[1] == E.UNKNOWN_TYPE


def test_a_map_too_big_for_the_welcome_is_left_out_and_sent_on_request():
    many = {f"m{i:02d}": ((f"10.0.0.{i + 1}", 7400), (f"10.0.0.{i + 1}", 7500)) for i in range(40)}
    core, cmap = _member_core({**many, "n1": TWO["n1"]}, partitions=256)
    (c,) = connect(core, ("127.0.0.9", 5000))
    hello = wire.encode_hello(c.cid)
    (s,) = sends(core.handle_datagrams([(hello, c.addr)], 0.0))
    assert len(s.data) <= 3 * len(hello)  # the anti-amplification budget holds
    f = wire.decode_untrusted_frame(s.data)
    assert f[0] is T.WELCOME and f[5] is None and f[3]["map_epoch"] == 1
    (r,) = frames_to(c.send(wire.encode_map_request(c.cid, c.cookie), 0.0), c.addr)
    assert r == (T.REDIRECT, "n1", cmap)


def test_a_misrouted_pub_is_forwarded_and_redirected_once_per_epoch():
    core, cmap = _member_core()
    (c,) = connect(core, ("127.0.0.9", 5000))
    elsewhere, here = _topic(cmap, "n2"), _topic(cmap, "n1")
    out = c.pub([(elsewhere, b"1")])
    assert [a.member for a in out if isinstance(a, Forward)] == ["n2"]
    assert [f for f in frames_to(out, c.addr) if f[0] is T.REDIRECT] == [(T.REDIRECT, "n1", cmap)]
    out = c.pub([(elsewhere, b"2"), (here, b"3")])  # the same epoch: forwarded, not redirected again
    assert [a.member for a in out if isinstance(a, Forward)] == ["n2"]
    assert [f[0] for f in frames_to(out, c.addr)] == [T.PUBACK]
    assert [f[0] for f in frames_to(c.pub([(here, b"4")]), c.addr)] == [T.PUBACK]  # ours: nothing to say
    newer = dataclasses.replace(cmap, epoch=2)
    core.set_cluster_map(clustermap.encode(newer), 2)
    out = c.pub([(elsewhere, b"5")])
    assert [f for f in frames_to(out, c.addr) if f[0] is T.REDIRECT] == [(T.REDIRECT, "n1", newer)]
    assert not [f for f in frames_to(c.pub([(elsewhere, b"6")]), c.addr) if f[0] is T.REDIRECT]
    assert core.metrics["redirects"] == 2


def test_a_sub_for_a_partition_led_elsewhere_is_redirected_once_per_epoch():
    core, cmap = _member_core()
    (c,) = connect(core, ("127.0.0.9", 5000))
    elsewhere, here = _topic(cmap, "n2"), _topic(cmap, "n1")
    assert not [f for f in frames_to(c.sub(here), c.addr) if f[0] is T.REDIRECT]
    assert [f for f in frames_to(c.sub(elsewhere), c.addr) if f[0] is T.REDIRECT] == [(T.REDIRECT, "n1", cmap)]
    assert not [f for f in frames_to(c.sub(_topic(cmap, "n2", "u")), c.addr) if f[0] is T.REDIRECT]
