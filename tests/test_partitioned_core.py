"""Partitioned mode's sans-IO pieces, directly: ownership, forwarding queues, push numbering,
peer frame validation, and a member core in the simulator (held CMDACKs, bad FORWARD frames)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

import pytest

from roost.client import clustermap, decoding, ring, wire
from roost.client.ring import partition_of
from roost.client.wire import ErrorCode, FrameType
from roost.cluster.events import Close, Datagrams, LinkBytes, Log, Send, SendFrame, Tick
from roost.cluster.forwarding import ForwardQueue
from roost.cluster.peerwire import (
    FrameDecoder,
    PeerProtocolError,
    PeerType,
    check_forwarded_untrusted,
    check_partitions_untrusted,
    check_relay_untrusted,
    encode,
)
from roost.cluster.replication import PeerQueue
from roost.node import versions
from roost.node.config import NodeConfig
from roost.node.core import BrokerCore, Forward
from roost.node.ownership import Ownership
from sim.check import Published
from sim.simulation import Simulation
from tests.corekit import connect, frames_to, make_core, replicated, sends

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


def _fmsg(topic: str, size: int = 0) -> list[Any]:
    return [topic, None, None, b"x" * size, None, None]


def test_a_forward_frame_holds_at_most_about_max_bytes():
    """Large messages come in parts of up to 64 KB: 256 of them would not fit one peer frame."""
    q = ForwardQueue(max_queue=1000, max_bytes=200_000, window=100)
    q.add([_fmsg(f"m{i}", 65_000) for i in range(7)] + [_fmsg("huge", 300_000), _fmsg("s1"), _fmsg("s2")])
    sizes = []
    while (f := q.next_frame()) is not None:
        sizes.append([m[0] for m in f[1]])
    assert sizes == [["m0", "m1", "m2"], ["m3", "m4", "m5"], ["m6"], ["huge"], ["s1", "s2"]]


def test_forward_queue_windows_requeues_in_order_and_bounds_memory():
    q = ForwardQueue(max_queue=5, chunk=2, window=2)
    assert [m[0] for m in q.add([_fmsg(f"m{i}") for i in range(7)])] == ["m5", "m6"]  # (dropped: to give up)
    assert len(q) == 5
    f1, f2 = q.next_frame(), q.next_frame()
    assert f1 is not None and f2 is not None and q.next_frame() is None  # window of 2
    assert [m[0] for m in q.acked(f1[0], [])] == ["m0", "m1"]
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
    "x", [["t", None, None, b"p", PID]], [["t", None, None, b"p", PID, 1, 0]],
    [["bad topic\n", None, None, b"p", None, None]],
    [["t", None, None, "str", None, None]], [["t", None, None, b"p", None, 5]],
    [["t", None, None, b"p", b"short", 1]], [["t", None, None, b"p", PID, 0]],
    [["t", None, {"k": 1}, b"p", PID, 1]], [["t", None, None, b"p", PID, 2**63]],
])  # fmt: skip
def test_malformed_forwarded_messages_are_refused(msgs):
    with pytest.raises(PeerProtocolError):
        check_forwarded_untrusted(msgs)


def test_well_formed_forwards_relays_and_partitions_pass():
    ok = [
        ["t", "k", {"a": "b"}, b"p", PID, 7],
        ["t", None, None, b"", None, None],
        ["t", None, None, b"", PID, 2**63 - 1],
    ]  # (every sequence a PUB may carry: review finding)
    assert check_forwarded_untrusted(ok) == ok
    assert check_relay_untrusted([["127.0.0.1", 9, b"MSG t\nx"]]) == [(("127.0.0.1", 9), b"MSG t\nx")]
    assert check_partitions_untrusted([0, 3], 4) == {0, 3}
    for bad in ([["localhost", 9, b"x"]], [["127.0.0.1", 0, b"x"]], "x", [["127.0.0.1", 9, "x"]]):
        with pytest.raises(PeerProtocolError):
            check_relay_untrusted(bad)
    for bad_parts in ([4], [-1], ["0"], "x"):
        with pytest.raises(PeerProtocolError):
            check_partitions_untrusted(bad_parts, 4)


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
    out = core.handle(LinkBytes(inbound, encode([PeerType.FORWARD, 1, [["t", None, None, "not bytes", None, None]]])),
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
    to_client = [decoding.decode_untrusted_frame(a.data)[0] for a in out if isinstance(a, Send) and a.addr == addr]
    assert to_client == [wire.FrameType.REDIRECT]  # no CMDACK yet: held, the owners have not acknowledged
    assert core.replicator.held
    owners = [m for m in core.cmap.owners[core.own.partition(topic)] if m != "m0"]
    for peer in owners:  # the owners acknowledge our push
        lid = core.out[peer]
        assert lid is not None
        q = core.queues[peer]
        for seq in list(q.inflight):
            out = core.handle(LinkBytes(lid, encode([PeerType.PUSHACK, seq])), sim.now)
    assert any(isinstance(a, Send) and a.addr == addr for a in out) and not core.replicator.held  # the CMDACK


def test_a_member_acknowledges_a_forwarded_pub_when_the_fwdack_comes_back():
    sim = _ready_sim()
    core = sim.members["m0"].core
    assert core is not None
    topic = next(f"w{i}" for i in range(500) if core.cmap.owners[core.own.partition(f"w{i}")][0] != "m0")
    primary = core.cmap.owners[core.own.partition(topic)][0]
    cid, addr, pid = b"p" * 16, ("127.0.0.99", 5001), b"q" * 16
    cookie = core.broker.cookies.issue(addr, cid, sim.now + core.wall_offset)
    pub = wire.encode_pub(cid, cookie, pid, 1, 1, True, [wire.pack_message(topic, None, None, b"x")])
    out = core.handle(Datagrams([(pub, addr)]), sim.now)
    acks = [f for f in (decoding.decode_untrusted_frame(a.data) for a in out if isinstance(a, Send) and a.addr == addr)
            if f[0] is wire.FrameType.PUBACK and f[1] == pid]  # fmt: skip
    assert [f[2] for f in acks] == [0]  # (accepted, not yet at the primary)
    (fid,) = list(core.forwarding.queues[primary].inflight)
    lid = core.out[primary]
    assert lid is not None
    out = core.handle(LinkBytes(lid, encode([PeerType.FWDACK, fid, []])), sim.now)
    acks = [f for f in (decoding.decode_untrusted_frame(a.data) for a in out if isinstance(a, Send) and a.addr == addr)
            if f[0] is wire.FrameType.PUBACK and f[1] == pid]  # fmt: skip
    assert [f[2] for f in acks] == [1]


def test_a_heartbeat_with_an_epoch_out_of_range_closes_the_link():
    """An epoch near 2**64 would overflow msgpack at our next map change (review finding)."""
    sim = _ready_sim()
    core = sim.members["m0"].core
    assert core is not None
    inbound = next(x.id for x in core.links.values() if not x.outbound and x.peer == "m1")
    out = core.handle(LinkBytes(inbound, encode([PeerType.HEARTBEAT, "ready", 0, 0, 2**64 - 1, 0, 0])), sim.now)
    assert any(isinstance(a, Close) and a.link == inbound for a in out)
    assert core.maps.epoch_seen < 2**62


def test_a_pushack_of_no_sequence_is_a_protocol_error_not_a_crash_caught():
    """A PUSHACK whose sequence is not an integer (a list: unhashable) raised TypeError inside the
    peer queue, which only the member's last resort caught (``peer_error``); it is refused where
    the frame is read, as every other malformed frame is (fuzzing, tests/fuzz)."""
    sim = _ready_sim()
    core = sim.members["m0"].core
    assert core is not None
    lid = core.out["m1"]
    assert lid is not None
    out = core.handle(LinkBytes(lid, encode([PeerType.PUSHACK, [0]])), sim.now)
    assert any(isinstance(a, Close) and a.link == lid for a in out)
    assert [a.event for a in out if isinstance(a, Log) and a.level != "info"] == ["peer_protocol_error"]


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
    assert f[0] is FrameType.WELCOME and f[5] == cmap and f[3]["map_epoch"] == 1
    plain = make_core()
    (f,) = frames_to(plain.handle_datagrams([(wire.encode_hello(c.cid), c.addr)], 0.0), c.addr)
    assert f[5] is None and "map_epoch" not in f[3]
    (pc,) = connect(plain, ("127.0.0.9", 5001))
    (err,) = frames_to(pc.send(wire.encode_map_request(pc.cid, pc.cookie), 0.0), pc.addr)
    assert err[0] is FrameType.ERROR and err[1] == ErrorCode.UNKNOWN_TYPE


def test_a_map_too_big_for_the_welcome_is_left_out_and_sent_on_request():
    many = {f"m{i:02d}": ((f"10.0.0.{i + 1}", 7400), (f"10.0.0.{i + 1}", 7500)) for i in range(40)}
    core, cmap = _member_core({**many, "n1": TWO["n1"]}, partitions=256)
    (c,) = connect(core, ("127.0.0.9", 5000))
    hello = wire.encode_hello(c.cid)
    (s,) = sends(core.handle_datagrams([(hello, c.addr)], 0.0))
    assert len(s.data) <= 3 * len(hello)  # the anti-amplification budget holds
    f = decoding.decode_untrusted_frame(s.data)
    assert f[0] is FrameType.WELCOME and f[5] is None and f[3]["map_epoch"] == 1
    (r,) = frames_to(c.send(wire.encode_map_request(c.cid, c.cookie), 0.0), c.addr)
    assert r == (FrameType.REDIRECT, "n1", cmap)


def test_a_misrouted_pub_is_forwarded_and_redirected_once_per_epoch():
    core, cmap = _member_core()
    (c,) = connect(core, ("127.0.0.9", 5000))
    elsewhere, here = _topic(cmap, "n2"), _topic(cmap, "n1")
    out = c.pub([(elsewhere, b"1")])
    assert [a.member for a in out if isinstance(a, Forward)] == ["n2"]
    assert [f for f in frames_to(out, c.addr) if f[0] is FrameType.REDIRECT] == [(FrameType.REDIRECT, "n1", cmap)]
    out = c.pub([(elsewhere, b"2"), (here, b"3")])  # the same epoch: forwarded, not redirected again
    assert [a.member for a in out if isinstance(a, Forward)] == ["n2"]
    assert [f[0] for f in frames_to(out, c.addr)] == [FrameType.PUBACK]
    assert [f[0] for f in frames_to(c.pub([(here, b"4")]), c.addr)] == [FrameType.PUBACK]  # ours: nothing to say
    newer = dataclasses.replace(cmap, epoch=2)
    core.set_cluster_map(clustermap.encode(newer), 2)
    out = c.pub([(elsewhere, b"5")])
    assert [f for f in frames_to(out, c.addr) if f[0] is FrameType.REDIRECT] == [(FrameType.REDIRECT, "n1", newer)]
    assert not [f for f in frames_to(c.pub([(elsewhere, b"6")]), c.addr) if f[0] is FrameType.REDIRECT]
    assert core.metrics["redirects"] == 2


def test_a_forwarded_pub_is_acknowledged_only_once_the_primary_has_it():
    """The client moves a topic to its new primary once the old route acknowledged it; a
    PUBACK for a message still in our forward queue let later ones, sent straight to the
    new primary, overtake it (chaos seed 3: 3 reordered)."""
    core, cmap = _member_core()
    (c,) = connect(core, ("127.0.0.9", 5000))
    elsewhere, here = _topic(cmap, "n2"), _topic(cmap, "n1")
    out = c.pub([(here, b"1"), (elsewhere, b"2"), (here, b"3"), (elsewhere, b"4")])
    (fwd,) = [a for a in out if isinstance(a, Forward)]
    assert [m[5] for m in fwd.msgs] == [2, 4]
    assert [f[2] for f in frames_to(out, c.addr) if f[0] is FrameType.PUBACK] == [1]  # (not 2, 3, 4: 2 waits)
    # (a real producer's floor: its lowest sequence not acknowledged)
    out = c.send(wire.encode_pub(c.cid, c.cookie, c.pid, 5, 2, True, [wire.pack_message(here, None, None, b"5")]), 0.0)
    assert [f[2] for f in frames_to(out, c.addr) if f[0] is FrameType.PUBACK] == [1]
    out = core.settle_forwards(fwd.msgs[1:], 0.0)  # (4 is in n2's mailboxes; 2 still waits)
    assert [f[2] for f in frames_to(out, c.addr) if f[0] is FrameType.PUBACK] == [1]
    out = core.settle_forwards(fwd.msgs[:1], 0.0)
    assert [f[2] for f in frames_to(out, c.addr) if f[0] is FrameType.PUBACK] == [5]
    assert not core.settle_forwards(fwd.msgs, 0.0)  # (settled once: nothing more to say)
    # A producer acknowledged elsewhere (it failed over and came back) says so with its floor:
    # what still waits below it holds nothing back.
    out = c.pub([(elsewhere, b"6")])
    assert [f[2] for f in frames_to(out, c.addr) if f[0] is FrameType.PUBACK] == [5]
    out = c.send(wire.encode_pub(c.cid, c.cookie, c.pid, 8, 8, True, [wire.pack_message(here, None, None, b"8")]), 0.0)
    assert [f[2] for f in frames_to(out, c.addr) if f[0] is FrameType.PUBACK] == [8]


def test_a_sub_for_a_partition_led_elsewhere_is_redirected_once_per_epoch():
    core, cmap = _member_core()
    (c,) = connect(core, ("127.0.0.9", 5000))
    elsewhere, here = _topic(cmap, "n2"), _topic(cmap, "n1")
    assert not [f for f in frames_to(c.sub(here), c.addr) if f[0] is FrameType.REDIRECT]
    assert [f for f in frames_to(c.sub(elsewhere), c.addr) if f[0] is FrameType.REDIRECT] == [
        (FrameType.REDIRECT, "n1", cmap)
    ]
    assert not [f for f in frames_to(c.sub(_topic(cmap, "n2", "u")), c.addr) if f[0] is FrameType.REDIRECT]


# ---------------------------------------------------------------- client resets and homes (registers)

WALL = 1_800_000_000.0  # core time 0 is this Unix time: versions are ordinary HLC values
TOPIC_OF = {partition_of(f"t{i}", 4): f"t{i}" for i in range(50)}
CID = b"c" * 16
OWNERS = [("b", "c"), ("c", "b"), ("b", "c"), ("c", "b")]


def _pcore(me: str, idx: int, owners: Sequence[tuple[str, ...]]) -> BrokerCore:
    core = BrokerCore(NodeConfig(id=me), random.Random(idx), incarnation=1,
                      members=[[m, "127.0.0.1", 7400 + i] for i, m in enumerate("abc")], node_idx=idx,
                      wall_offset=WALL, replicating=True, tombstone_horizon=600.0)  # fmt: skip
    own = Ownership(me, 4)
    core.set_ownership(own)
    core.reindex(*own.update(1, owners))
    return core


def _v(t: float, idx: int, present: bool = True, flag: int = versions.RELIABLE) -> int:
    """A version written at core time ``t`` by member ``idx``."""
    return versions.make(int((WALL + t) * 1000 - versions.EPOCH_MS) << 12, idx, present, flag)


def _entry(cver: int, home: str, subs: list[list[Any]], session: int = 1) -> list[Any]:
    return [CID, cver, "127.0.0.9", 9000, home, subs, session]


def test_a_reset_voids_older_registers_identically_everywhere_and_a_renewal_wins():
    t0, t1 = TOPIC_OF[0], TOPIC_OF[2]
    b, c = _pcore("b", 1, OWNERS), _pcore("c", 2, OWNERS)
    first = _entry(_v(1, 0, flag=0), "a", [[t0, None, _v(1.001, 0)], [t1, None, _v(1.002, 0)]])
    reset = _v(5, 0)  # the home's reset (RELIABLE flag on a client register)
    renewed = [t0, None, _v(5.001, 0)]  # the SYNC renews t0 right after the reset; t1 not
    for core in (b, c):
        core.merge([first], 6.0)
    voids = replicated(b.merge([_entry(reset, "a", [])], 6.0))  # b hears the reset before the renewal
    c.merge([_entry(reset, "a", [renewed])], 6.0)  # c hears both at once
    vb, vc = b.clients[CID].subs, c.clients[CID].subs
    assert not versions.is_present(vb[(t1, None)]) and vb[(t1, None)] == vc[(t1, None)]  # the same tombstone
    assert vb[(t1, None)] >> versions.FLAG_BITS == reset >> versions.FLAG_BITS
    assert not versions.is_present(vb[(t0, None)]) and versions.is_present(vc[(t0, None)])
    # The void b wrote travels to c and loses there to the renewal; the renewal wins at b.
    assert [s[0] for e in voids for s in e[5]] and all(e[0] == CID for e in voids)
    c.merge(voids, 6.1)
    b.merge([_entry(reset, "a", [renewed])], 6.1)
    assert vb[(t0, None)] == vc[(t0, None)] == renewed[2]


def test_a_home_that_hears_a_client_is_dropped_elsewhere_takes_it_back():
    t0 = TOPIC_OF[0]
    b = _pcore("b", 1, OWNERS)  # b is the client's home (it talks to b) and t0's primary
    b.merge([_entry(_v(1, 1, flag=0), "b", [[t0, None, _v(1.001, 1)]])], 1.5)
    assert b.clients[CID].local
    drop = _v(2, 0, present=False)  # a (the old home, behind a partition) timed it out
    out = b.merge([_entry(drop, "a", [[t0, None, _v(2.001, 0, present=False) | (2 << 2)]])], 2.5)
    cl = b.clients[CID]
    assert cl.home == "b" and cl.local and cl.cver > drop and versions.is_present(cl.cver)
    assert versions.is_present(cl.subs[(t0, None)]) and cl.subs[(t0, None)] > drop
    assert any(e[0] == CID and e[4] == "b" and e[1] == cl.cver for e in replicated(out))  # told to all


def test_a_pull_gets_every_register_of_the_pullers_clients_and_a_new_home_gets_them_pushed():
    t0, t1 = TOPIC_OF[0], TOPIC_OF[1]
    b = _pcore("b", 1, [("b", "c"), ("b", "c"), ("c", "a"), ("c", "a")])
    b.merge([_entry(_v(1, 0, flag=0), "a", [[t0, None, _v(1.001, 0)], [t1, None, _v(1.002, 0)]])], 1.5)
    only_p0 = [e for e in b.dump({partition_of(t0, 4)}) if e[0] == CID]
    assert [s[0] for s in only_p0[0][5]] == [t0]
    whole = [e for e in b.dump({partition_of(t0, 4)}, home="a") if e[0] == CID]
    assert sorted(s[0] for s in whole[0][5]) == sorted([t0, t1])
    # The client moves its home to c: b pushes what it holds of the client (c's copy must be whole).
    out = b.merge([_entry(_v(3, 2, flag=0), "c", [])], 3.5)
    pushed = [e for e in replicated(out) if e[0] == CID]
    assert pushed and pushed[0][4] == "c" and sorted(s[0] for s in pushed[0][5]) == sorted([t0, t1])


def test_a_member_restarted_while_another_is_down_leaves_it_out_of_its_map_at_once():
    """Review finding #4: a never-heard peer counted live for down_after after a restart."""
    sim = _ready_sim()
    sim.crash("m2")
    down_after = sim.cc.settings.down_after
    assert sim.run_until(sim.now + down_after + 1.0)
    sim.crash("m0")
    sim.restart("m0")
    t0 = sim.now
    core = sim.members["m0"].core
    assert core is not None and core.membership.peers["m2"].state == "unknown"
    assert sim.run_until(t0 + down_after / 3)  # well before m2 could be "down" to the new m0
    assert core.membership.peers["m2"].state == "unknown" and "m2" in core.unreached
    assert core.cmap is not None and core.cmap.live == {"m0", "m1"}
    assert core.cmap.owners == sim.members["m1"].core.cmap.owners  # the same map as the survivor's


def test_a_forward_queue_parks_what_the_receiver_refused_until_routed_again():
    q = ForwardQueue(max_queue=10, chunk=3, window=2)
    a, b, c, d, e = (_fmsg(t) for t in "abcde")
    q.add([a, b, c])
    fid = (q.next_frame() or (0, []))[0]
    assert q.acked(fid, [0, 2, 99]) == [b]  # (an index past the frame is ignored)
    assert q.parked == [a, c] and len(q) == 2 and not q.inflight
    assert q.acked(fid, []) == []  # (a frame acknowledged twice settles nothing twice)
    assert q.take(everything=False) == [a, c] and len(q) == 0
    q.add([d])
    q.acked(q.next_frame()[0], [0])  # type: ignore[index]
    q.add([e])
    assert q.take(everything=False) == [d, e] and len(q) == 0  # (oldest first: d was sent first)


def test_a_member_delivers_forwards_it_owns_and_refuses_the_rest():
    """Review finding #6: a member that forwarded again and acknowledged lost messages when it stopped."""
    sim = _ready_sim()
    core = sim.members["m0"].core
    assert core is not None and core.cmap is not None
    topics = [f"w{i}" for i in range(500)]
    mine = next(t for t in topics if core.cmap.owners[core.own.partition(t)][0] == "m0")
    theirs = next(t for t in topics if "m0" not in core.cmap.owners[core.own.partition(t)])
    inbound = next(x.id for x in core.links.values() if not x.outbound and x.peer == "m1")
    before = core.broker.metrics["forwarded_in"]
    sim.check.published[(9, 2)] = Published(mine, ())  # (the simulator's accounting parses payloads)
    msgs = [[theirs, None, None, b"9:1", PID, 1], [mine, None, None, b"9:2", PID, 2]]
    out = core.handle(LinkBytes(inbound, encode([PeerType.FORWARD, 5, msgs])), sim.now)
    dec = FrameDecoder(1 << 20)
    for a in out:
        if isinstance(a, SendFrame) and a.link == inbound:
            dec.feed(a.data)
    assert dec.next_frame_untrusted() == [PeerType.FWDACK, 5, [0]]  # the first refused: m0 does not own it
    assert core.broker.metrics["forwarded_in"] == before + 1


def test_a_forward_resent_after_a_link_drop_is_not_published_again():
    """Seeds 5317 and 7386: the primary paused; its peer's link dropped with FORWARD frames the
    primary took but never acknowledged, and a SUB pushed between them. The sender sent them
    again, and the subscriber got the older messages after the newer ones."""
    t1 = TOPIC_OF[2]
    b = _pcore("b", 1, OWNERS)  # t1's primary
    assert b.forwarded([[t1, None, None, b"old", PID, 7]], 1.0)[1] == []  # no subscriber yet
    b.merge([_entry(_v(1, 0, flag=0), "a", [[t1, None, _v(1.001, 0)]])], 1.5)
    b.forwarded([[t1, None, None, b"new", PID, 9]], 1.6)
    mailbox = b.clients[CID].mailbox
    assert mailbox is not None and len(mailbox) == 1
    # the resend of both frames after the link drop: acknowledged (nothing refused), not delivered
    assert b.forwarded([[t1, None, None, b"old", PID, 7], [t1, None, None, b"new", PID, 9]], 2.0)[1] == []
    assert len(mailbox) == 1 and b.metrics["forward_duplicates"] == 2
    # forgotten after producer_timeout, as a member forgets a silent producer
    b.forwarded([[t1, None, None, b"old", PID, 7]], 2.0 + b.cfg.producer_timeout)
    assert len(mailbox) == 2 and b.metrics["forward_duplicates"] == 2


def test_a_mailbox_voided_by_a_reset_waits_for_the_renewal_and_its_stream_goes_on():
    """Seed 6388: the reset reached an owner before the renewal (which came by another map),
    and the messages waiting for the subscriber went with the voided subscription."""
    t1 = TOPIC_OF[2]
    b = _pcore("b", 1, OWNERS)
    b.merge([_entry(_v(1, 0, flag=0), "a", [[t1, None, _v(1.001, 0)]])], 1.5)
    b.forwarded([[t1, None, None, b"waiting", PID, 1]], 1.6)  # b is t1's primary: into the mailbox
    cl = b.clients[CID]
    mailbox = cl.mailbox
    assert mailbox is not None and len(mailbox) == 1
    b.merge([_entry(_v(5, 0), "a", [])], 6.0)  # the reset alone
    assert cl.mailbox is None and cl.parked is not None and not versions.is_present(cl.subs[(t1, None)])
    b.merge([_entry(_v(5, 0), "a", [[t1, None, _v(5.001, 0)]])], 6.1)  # the renewal, same session and address
    assert cl.mailbox is mailbox and len(mailbox) == 1 and b.metrics["mailboxes_resumed"] == 1


def test_a_void_written_by_another_owner_keeps_the_mailbox_for_the_renewal_too():
    """Seed 215: the void came as another member's tombstone (stamped with the reset's own version)
    in the entry with the reset, before the renewal; b dropped the mailbox and its waiting message
    instead of keeping it, as it does for a void it makes itself."""
    t1 = TOPIC_OF[2]
    b = _pcore("b", 1, OWNERS)
    b.merge([_entry(_v(1, 0, flag=0), "a", [[t1, None, _v(1.001, 0)]])], 1.5)
    b.forwarded([[t1, None, None, b"waiting", PID, 1]], 1.6)
    cl = b.clients[CID]
    mailbox = cl.mailbox
    assert mailbox is not None and len(mailbox) == 1
    reset = _v(5, 0)
    void = reset >> versions.FLAG_BITS << versions.FLAG_BITS | versions.RELIABLE  # (absent, unsubscribed)
    b.merge([_entry(reset, "a", [[t1, None, void]])], 6.0)
    assert cl.mailbox is None and cl.parked is not None and not versions.is_present(cl.subs[(t1, None)])
    b.merge([_entry(reset, "a", [[t1, None, _v(5.001, 0)]])], 6.1)
    assert cl.mailbox is mailbox and len(mailbox) == 1 and b.metrics["mailboxes_resumed"] == 1
    # an unsubscribe of its own version (not the reset's) ends the stream
    b.merge([_entry(reset, "a", [[t1, None, _v(7, 0, present=False)]])], 7.1)
    assert cl.mailbox is None and cl.parked is None


def test_a_mailbox_that_owes_messages_of_a_partition_moved_away_outlives_the_last_unsubscribe_here():
    """Seed 791: b, t1's old primary, collected the client's t1 register once the map moved t1 away,
    while b's mailbox still owed the client t1's messages; the client's unsubscribe of t0, its
    last register at b, then dropped the mailbox with them."""
    t0, t1 = TOPIC_OF[0], TOPIC_OF[2]  # (both b's in OWNERS)
    b = _pcore("b", 1, OWNERS)
    b.merge([_entry(_v(1, 0, flag=0), "a", [[t0, None, _v(1.001, 0)], [t1, None, _v(1.002, 0)]])], 1.5)
    b.forwarded([[t1, None, None, b"owed", PID, 1]], 1.6)
    cl = b.clients[CID]
    mailbox = cl.mailbox
    assert mailbox is not None and len(mailbox) == 1
    b.reindex(*b.own.update(2, [("b", "c"), ("c", "b"), ("c", "a"), ("c", "b")]))  # (t1 moves away from b)
    b.collect_tombstones(2.0)
    assert (t1, None) in cl.subs  # (kept while the mailbox owes)
    b.merge([_entry(_v(1, 0, flag=0), "a", [[t0, None, _v(3, 0, present=False)]])], 3.0)
    assert cl.mailbox is mailbox and len(mailbox) == 1
    mailbox.base = len(mailbox.buf)  # (the client acknowledged it)
    b.collect_tombstones(4.0)
    assert (t1, None) not in cl.subs


def test_an_old_subscriptions_owing_mailbox_outlives_the_last_unsubscribe_too():
    """Fourth review: the horizon was counted from the register's version (an hour-old subscription
    lost the seed-791 fix at once), not from when the map took the partition away."""
    t0, t1 = TOPIC_OF[0], TOPIC_OF[2]
    b = _pcore("b", 1, OWNERS)
    b.merge([_entry(_v(1, 0, flag=0), "a", [[t0, None, _v(1.001, 0)], [t1, None, _v(1.002, 0)]])], 1.5)
    b.forwarded([[t1, None, None, b"owed", PID, 1]], 3600.0)
    cl = b.clients[CID]
    mailbox = cl.mailbox
    assert mailbox is not None and len(mailbox) == 1
    gained, lost = b.own.update(2, [("b", "c"), ("c", "b"), ("c", "a"), ("c", "b")])  # (t1 moves away from b)
    b.reindex(gained, lost, 3600.2)
    b.collect_tombstones(3600.5)
    b.merge([_entry(_v(1, 0, flag=0), "a", [[t0, None, _v(3601, 0, present=False)]])], 3601.0)
    assert cl.mailbox is mailbox and len(mailbox) == 1


def test_a_mailbox_always_owing_keeps_a_moved_partitions_registers_no_longer_than_the_horizon():
    """Third review: steady traffic on t0 kept b's mailbox owing at every collection, and so the
    client's t1 register (t1 moved away: b hears none of its changes) for ever; the client's
    unsubscribe of t1 at its new owner, collected there, would come back with t1 to b."""
    t0, t1 = TOPIC_OF[0], TOPIC_OF[2]
    b = _pcore("b", 1, OWNERS)
    b.merge([_entry(_v(1, 0, flag=0), "a", [[t0, None, _v(1.001, 0)], [t1, None, _v(1.002, 0)]])], 1.5)
    gained, lost = b.own.update(2, [("b", "c"), ("c", "b"), ("c", "a"), ("c", "b")])  # (t1 moves away from b)
    b.reindex(gained, lost, 1.002)
    cl = b.clients[CID]
    for seq, t in enumerate(range(2, 2000, 100), 1):
        b.forwarded([[t0, None, None, b"m%d" % seq, PID, seq]], float(t))
        b.collect_tombstones(t + 0.01)
        assert cl.mailbox is not None and len(cl.mailbox) > 0
        assert ((t1, None) in cl.subs) == (t + 0.01 - 1.002 < b.tombstone_horizon)


def test_an_overflowed_peer_queue_holds_no_cmdack():
    """Review finding #8: entries dropped on overflow were never acknowledged, so every CMDACK
    waited down_after while anti-entropy repaired the peer."""
    q = PeerQueue(max_queue=3, chunk=2, window=8)
    q.add([[b"a", 0, "h", 1, "n", [["t", None, 1]], 0]] * 4)  # over max_queue: dropped
    assert q.overflowed and q.acked_through == q.added == 4
    q.add([[b"a", 0, "h", 1, "n", [["t", None, 1]], 0]])  # (while overflowed: nothing queued)
    assert q.acked_through == q.added == 5 and len(q) == 0
    q.repaired()
    q.add([[b"b", 0, "h", 1, "n", [["t", None, 1]], 0]])
    push = q.next_push()
    assert push is not None and q.acked_through == 5 < q.added
    q.acked(push[0])
    assert q.acked_through == q.added == 6


def test_a_repair_in_flight_is_pushed_again_after_a_link_drop():
    """Review finding #12: it was dropped, and the peer waited a whole anti-entropy round."""
    q = PeerQueue(max_queue=100, chunk=1, window=2)
    e1, e2, e3 = ([bytes([i]) * 16, 0, "h", 1, "n", [["t", None, i]], 0] for i in (1, 2, 3))
    q.add_repair([e1, e2, e3])
    sent = [q.next_push(), q.next_push()]
    assert [p[1] for p in sent if p] == [[e1], [e2]] and q.next_push() is None  # window of 2
    q.disconnected()
    again = [q.next_push(), q.next_push()]
    assert [p[1] for p in again if p] == [[e1], [e2]]
    q.acked(again[0][0])  # type: ignore[index]
    third = q.next_push()
    assert third is not None and third[1] == [e3] and q.acked_through == 0 == q.added


def test_a_hand_off_is_taken_lazily_after_the_repair_and_no_repair_replaces_it():
    """Review finding #9: the hand-off was built in one turn (1.4 s for 200,000 subscriptions)."""
    q = PeerQueue(max_queue=100, chunk=1, window=8)
    made: list[int] = []

    def entries(tag: int):
        for i in range(3):
            made.append(tag)
            yield [bytes([tag, i]) * 8, 0, "h", 1, "n", [["t", None, i + 1]], 0]

    q.add_handoff(entries(1))
    assert made == []  # nothing built yet
    q.add_repair(entries(2))
    q.add_repair(entries(3))  # (a newer repair replaces the first, not the hand-off)
    got = [push[1][0][0][0] for push in iter(q.next_push, None)]
    assert got == [3, 3, 3, 1, 1, 1] and q.handoff is None and q.acked_through == 0


def test_a_leaver_that_hears_no_owner_keeps_a_publish_unacknowledged_until_one_is_live():
    """Review, 2026-11-24 (seed 9642): a leaver cut off when its leave was committed sees no
    placed member live, so no partition has an owner in its map; it published what it took to
    nobody and acknowledged it. Now the message waits, unacknowledged, routed again every
    heartbeat."""
    sim = Simulation(5, members=4, clients=2, faults=(), fault_time=2.0, quiet=1.0, mode="partitioned")
    assert sim.run_until(3.0)
    core = sim.members["m3"].core
    assert core is not None and core.cmap is not None
    # a subscriber that never acknowledges holds a message at m3, so m3 keeps draining after its leave
    mine = next(f"s{i}" for i in range(999) if core.cmap.owners[core.own.partition(f"s{i}")][0] == "m3")
    sub, pb = connect(core.broker, ("127.0.0.98", 5002), ("127.0.0.97", 5003))
    sub.sub(mine, now=sim.now)
    pb.pub([(mine, b"held")], now=sim.now)
    sim.nemesis.leave(0.0, victim="m3")
    t = 3.0
    while core.leave_by == float("inf"):
        t += 0.01
        assert sim.run_until(t)
    # from here on m3 hears no one: its core is driven alone until every peer is down in its view
    now = sim.now
    for i in range(1, 30):
        core.handle(Tick(), now + 0.2 * i)
    now += 6.0
    assert core.ready and core.own.unowned("w1")
    before = core.broker.metrics["rerouted_here"] + core.broker.metrics["forwarded_in"]
    pub = wire.encode_pub(pb.cid, pb.cookie, b"q" * 16, 1, 1, True, [wire.pack_message("w1", None, None, b"x")])
    out = core.handle(Datagrams([(pub, pb.addr)]), now)
    assert [f for f in frames_to(out, pb.addr) if f[0] is FrameType.PUBACK and f[2] >= 1] == []
    assert [m[3] for m in core.forwarding.unrouted] == [b"x"]
    for i in range(1, 10):  # (heartbeats go by: still unacknowledged, still kept)
        out = core.handle(Tick(), now + 0.2 * i)
        assert [f for f in frames_to(out, pb.addr) if f[0] is FrameType.PUBACK and f[2] >= 1] == []
    assert [m[3] for m in core.forwarding.unrouted] == [b"x"]
    assert core.broker.metrics["rerouted_here"] + core.broker.metrics["forwarded_in"] == before
