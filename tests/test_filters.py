"""Wildcard and query subscriptions in the broker core, the client session, and a real node."""

from __future__ import annotations

import socket

import pytest
import trio

from roost.client import Client, decoding, wire
from roost.client.wire import FrameType, Mode
from tests.clusterkit import node_process  # noqa: F401  (the fixture ``node``: a node process)
from tests.corekit import connect, delivered, frames_to, make_core, sends
from tests.test_session import connected_session, wrap

A = ("127.0.0.1", 5001)
B = ("127.0.0.1", 5002)
C = ("127.0.0.1", 5003)


def text(core, data: bytes, addr=A, now=0.0):
    return core.handle_datagrams([(data, addr)], now)


def test_text_wildcard_subscription_and_wildcard_publish_refused():
    core = make_core()
    assert sends(text(core, b"SUB demo.*\n")) == []
    text(core, b"SUB t1\n")  # a FASTPUSS topic without dots: exactly itself
    out = core.handle_datagrams([(b"PUB demo.a\nx", B), (b"PUB demo.a.b\ny", B), (b"PUB demox\nz", B),
                                 (b"PUB t1\nw", B), (b"PUB t1x\nv", B)], 0.0)  # fmt: skip
    assert [s.data for s in sends(out)] == [b"MSG demo.a\nx", b"MSG t1\nw"]
    before = core.state_digest()
    for bad, says in (
        (b"PUB demo.*\nx", b"ERR bad_topic '*' and '>' are wildcards"),
        (b"SUB ord*\n", b"ERR bad_topic topic filter: '*' and '>' are wildcards and must be whole"),
    ):
        (reply,) = sends(text(core, bad, addr=C))
        assert says.startswith(reply.data) and len(reply.data) == min(len(says), 3 * len(bad)), reply.data
    assert core.state_digest() == before
    text(core, b"UNSUB demo.*\n")
    assert sends(text(core, b"PUB demo.a\nx", addr=B)) == []
    assert core.index.filters == {}


def test_overlapping_subscriptions_get_one_copy_in_the_strongest_mode():
    core = make_core()
    sub, pub = connect(core, A, B)
    sub.cmds([(1, "orders.eu", None, 0), (1, "orders.*", None, 1), (1, "orders.>", "k", 0),
              (1, "orders.* where amount > 100", None, 0)])  # fmt: skip
    cases = [(None, None), ("k", {"amount": "500"}), (None, {"amount": "5"})]
    packed = [wire.pack_message("orders.eu", k, tags, b"%d" % i) for i, (k, tags) in enumerate(cases)]
    out = pub.send(wire.encode_pub(pub.cid, pub.cookie, pub.pid, 1, 1, True, packed), 0.0)
    got = delivered(out, A)
    assert [p for _, _, p in got] == [b"0", b"1", b"2"]  # once each
    assert all(stream > 0 for stream, _, _ in got)  # reliable: orders.* is the strongest
    packed = [wire.pack_message(t, k, None, t.encode()) for t, k in
              [("orders.eu.x", "k"), ("orders.eu.x", None), ("ordersx", "k")]]  # fmt: skip
    out = pub.send(wire.encode_pub(pub.cid, pub.cookie, pub.pid, 4, 4, True, packed), 0.0)
    assert [p for _, _, p in delivered(out, A)] == [b"orders.eu.x"]  # only orders.> with key k


def test_a_malformed_filter_is_refused_and_changes_nothing():
    """A CMDS's filters are parsed where a subscription is made (once the budgets let it): a
    bad one gets bad_topic in its slot of the CMDACK and changes nothing, the others apply."""
    core = make_core()
    (sub,) = connect(core, A)
    sub.cmds([(1, "ok", None, 0)])
    for bad in ("a.>.b", "a where amount >", "a queue=x y", "a.* where kind = 'x' OR y = 1"):
        out = sub.cmds([(1, bad, None, 0), (0, bad, None, 0), (1, "ok2", None, 0)])
        (f,) = frames_to(out, A)
        assert f[0] is FrameType.CMDACK and f[3] == [wire.ErrorCode.BAD_TOPIC, wire.ErrorCode.OK, wire.ErrorCode.OK], f
        sub.cmds([(0, "ok2", None, 0)])
        assert core.index.count == 1 and core.clients[sub.cid].live == 1


def test_the_session_hands_a_message_to_every_subscription_it_passes():
    s = connected_session()
    exact = s.subscribe("a.b", None, Mode.RELIABLE)
    star = s.subscribe("a.*", None, Mode.RELIABLE)
    rest = s.subscribe("a.>", None, Mode.RELIABLE)
    big = s.subscribe("a.> where n > 1", None, Mode.RELIABLE)
    msgs = [wire.pack_delivery(t, None, {"n": n}, t.encode(), b"p" * 16, i + 1)
            for i, (t, n) in enumerate([("a.b", "5"), ("a.c.d", "0"), ("a.c.d", "9"), ("b.c", "9")])]  # fmt: skip
    s.handle_datagrams(wrap([wire.encode_msgs(7, 1, msgs)]), 0.1)
    assert [m.payload for m in exact.messages()] == [b"a.b"]
    assert [m.payload for m in star.messages()] == [b"a.b"]
    assert [m.sequence for m in rest.messages()] == [1, 2, 3]
    assert [m.sequence for m in big.messages()] == [1, 3]
    s.unsubscribe("a.> where n > 1", None)
    s.unsubscribe("a.>", None)
    s.unsubscribe("a.*", None)
    assert s.recv.trie.size == 0 and s.recv.filter_refs == {}


async def test_library_wildcards_queries_and_text_subscribers_on_a_real_node(node):
    async with Client(node.addr) as c:
        with pytest.raises(ValueError, match="must be whole tokens"):
            c.subscribe("demo.a*")
        with pytest.raises(ValueError, match="position 7"):
            c.subscribe("demo.>", query="amount > 'x'")
        with pytest.raises(wire.WireError, match="wildcards, for subscriptions only"):
            await c.publish("demo.*", "x")
        text = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        text.settimeout(5)
        try:
            text.sendto(b"SUB demo.>\n" + b"." * 40, ("127.0.0.1", node.port))  # (padded: 3x of it may come)
            async with c.subscribe("demo.>") as every, c.subscribe("demo.*", query="kind = 'order'") as orders:
                for topic, kind in (("demox", "order"), ("demo.a", "order"), ("demo.b.c", "order"), ("demo.d", "x")):
                    await c.publish(topic, topic, tags={"kind": kind})
                with trio.fail_after(10):
                    assert [(await every.next()).topic for _ in range(3)] == ["demo.a", "demo.b.c", "demo.d"]
                    assert (await orders.next()).topic == "demo.a"
                with pytest.raises(TimeoutError):
                    await orders.next(timeout=0.2)
            got = sorted(text.recv(1024) for _ in range(3))
            assert got == [b"MSG demo.a\ndemo.a", b"MSG demo.b.c\ndemo.b.c", b"MSG demo.d\ndemo.d"]
        finally:
            text.close()


# ---------------------------------------------------------------- queue groups in the core


def _marked(actions, addr) -> list[tuple[bytes, list]]:
    """(payload, marks) of each message to ``addr``, marks [] when the node picked nobody."""
    out = []
    for f in frames_to(actions, addr):
        if f[0] is FrameType.MSGS:
            out += [(m[3], m[-1] if len(m) in (5, 7) else []) for m in f[3]]
    return out


def test_a_queue_group_gets_each_message_once_round_robin_and_marked():
    core = make_core()
    a, b, c, pub = connect(core, A, B, C, ("127.0.0.1", 5004))
    for member in (a, b, c):
        member.sub("jobs.* queue=w")
    a.sub("jobs.>", mode=Mode.FIRE)  # a plain subscription of a member too: every message, once
    out = pub.pub([("jobs.x", b"%d" % i) for i in range(30)])
    got = {m.addr: _marked(out, m.addr) for m in (a, b, c)}
    w = [wire.mark_id("jobs.* queue=w", None)]
    picked = {addr: [p for p, marks in msgs if marks == w] for addr, msgs in got.items()}
    assert sorted(p for ps in picked.values() for p in ps) == sorted(b"%d" % i for i in range(30))
    assert [len(ps) for ps in picked.values()] == [10, 10, 10]
    # (a: all, once each; those picked for the group come reliably, the rest by fire: two streams)
    assert sorted(p for p, _ in got[A]) == sorted(b"%d" % i for i in range(30))
    assert len(got[B]) == len(got[C]) == 10


def test_the_unacknowledged_messages_of_a_member_that_times_out_go_to_the_rest_of_the_group():
    core = make_core(subscriber_timeout=3.0)
    a, b, pub = connect(core, A, B, C)
    a.sub("jobs queue=w")
    b.sub("jobs queue=w")
    out = pub.pub([("jobs", b"%d" % i) for i in range(10)], now=0.0)
    to_a, to_b = delivered(out, A), delivered(out, B)
    assert len(to_a) == len(to_b) == 5
    a.ack(to_a[0][0], 2, now=0.1)  # a took two, then went silent
    b.ack(to_b[0][0], 5, now=0.1)
    again = []
    for t in (1.0, 2.0, 3.0, 4.0):
        b.ping(t)
        again += delivered(core.tick(t), B)
    assert a.cid not in core.clients
    assert sorted(p for _, _, p in again) == sorted(p for _, _, p in to_a[2:])
    assert [s for _, s, _ in again] == [6, 7, 8]  # (b's own stream goes on)
    assert core.metrics["queue_redelivered"] == 3
    # and the group is b alone now
    assert [p for _, _, p in delivered(pub.pub([("jobs", b"late")], now=4.5), B)] == [b"late"]


# ---------------------------------------------------------------- limits near capacity (ADR 033)


def test_new_subscriptions_are_refused_over_capacity_above_the_share_of_the_node_limit():
    core = make_core(max_subscriptions=10, admission_share=0.8)
    a, b = connect(core, A, B)
    (ack,) = frames_to(a.cmds([(1, f"t{i}", None, 1) for i in range(8)]), A)
    assert ack[3] == [0] * 8
    (ack,) = frames_to(b.cmds([(1, "t0", None, 1), (1, "u", None, 1)]), B)
    assert ack[3] == [wire.ErrorCode.OVER_CAPACITY, wire.ErrorCode.OVER_CAPACITY]  # 8 of 10 held: 80%
    (ack,) = frames_to(a.cmds([(1, "t0", None, 0)]), A)  # (a change of one in force is no new one)
    assert ack[3] == [0] and core.metrics["refused_over_capacity"] == 2
    a.cmds([(0, "t7", None, 0)])
    (ack,) = frames_to(b.cmds([(1, "u", None, 1)]), B)
    assert ack[3] == [0]


def test_mailbox_bytes_above_the_share_refuse_new_subscriptions_until_they_drain():
    core = make_core(max_mailbox_bytes=1 << 20, admission_share=0.5, mailbox_max_bytes=1 << 20, send_window=1000)
    slow, late, pub = connect(core, A, B, C)
    slow.sub("big")
    out = []
    for i in range(70):  # 70 x 8 KB unacknowledged: above half of 1 MiB
        out += pub.pub([("big", b"x" * 8000)], now=0.01 * i)
    (ack,) = frames_to(late.cmds([(1, "other", None, 1)], now=1.0), B)
    assert ack[3] == [wire.ErrorCode.OVER_CAPACITY]
    stream = delivered(out, A)[0][0]
    slow.ack(stream, 70, now=1.5)
    (ack,) = frames_to(late.cmds([(1, "other", None, 1)], now=1.6), B)  # (bytes are summed at most once a second)
    assert ack[3] == [wire.ErrorCode.OVER_CAPACITY]
    (ack,) = frames_to(late.cmds([(1, "other", None, 1)], now=2.1), B)
    assert ack[3] == [0]


# ---------------------------------------------------------------- queue groups: review findings


def test_a_requeued_message_passes_over_a_member_whose_mailbox_is_full_by_bytes():
    core = make_core(subscriber_timeout=3.0, mailbox_max_bytes=65536)
    a, b, c, pub = connect(core, A, B, C, ("127.0.0.1", 5004))
    for m in (a, b, c):
        m.sub("jobs queue=w")
    out = []
    for i in range(12):
        out += pub.pub([("jobs", bytes([65 + i]) * 15000)], now=0.0)
    to = {m.addr: delivered(out, m.addr) for m in (a, b, c)}
    assert [len(v) for v in to.values()] == [4, 4, 4]
    c.ack(to[C][0][0], 4, now=0.1)  # c took all of its share; b holds 4 x 15 KB (full by bytes); a dies
    for t in (1.0, 2.0, 3.0, 4.0):
        b.ping(t)
        c.ping(t)
        core.tick(t)
    assert a.cid not in core.clients
    assert (core.metrics["queue_undeliverable"], core.metrics["queue_redelivered"]) == (0, 4)


def test_leaving_a_group_with_another_reliable_subscription_hands_its_messages_on_once():
    core = make_core(mailbox_capacity=16, send_window=16)
    a, b, pub = connect(core, A, B, C)
    a.sub("jobs queue=w")
    b.sub("jobs queue=w")
    a.sub("other")  # a keeps a reliable subscription: its mailbox stays
    to_a = delivered(pub.pub([("jobs", b"%d" % i) for i in range(10)], now=0.0), A)
    assert len(to_a) == 5
    out = a.cmds([(0, "jobs queue=w", None, 0)], now=0.1)  # a leaves before it took them
    assert sorted(p for _, _, p in delivered(out, B)) == sorted(p for _, _, p in to_a)
    assert core.metrics["queue_redelivered"] == 5
    # its mailbox no longer marks them for the group: an overflow later does not hand them on again
    pub.pub([("other", b"o%d" % i) for i in range(20)], now=0.2)
    assert core.metrics["cancelled_out_of_capacity"] == 1 and core.metrics["queue_redelivered"] == 5


def test_an_overflowing_member_s_group_messages_go_to_the_others_once():
    core = make_core(mailbox_capacity=16, send_window=16)
    a, b, pub = connect(core, A, B, C)
    a.sub("jobs queue=w")
    b.sub("jobs queue=w")
    a.sub("other")
    to_a = delivered(pub.pub([("jobs", b"%d" % i) for i in range(4)], now=0.0), A)
    a.ack(to_a[0][0], 0, sack=[[1, 2]], now=0.1)  # received, not yet taken (SACKed)
    out = pub.pub([("other", b"o%d" % i) for i in range(20)], now=0.2)  # a's mailbox overflows
    assert [f[3] for f in frames_to(out, A) if f[0] is FrameType.CANCEL] == ["out_of_capacity", "out_of_capacity"]
    assert core.metrics["queue_redelivered"] == 2


G = "jobs queue=w"


def _group_msg(i: int) -> bytes:
    return wire.mark_delivery(wire.pack_delivery("jobs", None, None, b"%d" % i, b"p" * 16, i), [wire.mark_id(G, None)])


def _acks(s, now):
    return [f for f in map(decoding.decode_untrusted_frame, [d for _, d in s.outgoing(now)]) if f[0] is FrameType.ACK]


def test_the_client_acknowledges_a_group_s_messages_as_they_are_taken():
    s = connected_session()
    st = s.subscribe(G, None, Mode.RELIABLE)
    plain = s.subscribe("other", None, Mode.RELIABLE)
    msgs = [_group_msg(1), _group_msg(2), wire.pack_delivery("other", None, None, b"o", b"q" * 16, 1), _group_msg(4)]
    s.handle_datagrams(wrap([wire.encode_msgs(7, 1, msgs)]), 0.1)
    (a,) = _acks(s, 0.1)
    assert (a[4], a[5]) == (0, [(1, 4)])  # nothing taken: held, SACKed
    s.consumed(st)
    st.take()
    (a,) = _acks(s, 0.2)
    assert (a[4], a[5]) == (1, [(2, 4)])
    for _ in range(2):
        s.consumed(st)
        st.take()
    (a,) = _acks(s, 0.3)
    assert (a[4], a[5]) == (4, [])  # (the plain message counted as taken on arrival)
    assert [m.payload for m in plain.messages()] == [b"o"]
    assert not s.flushed(0) or not any(rs.need_ack for rs in s.recv.streams.values())


def test_unsubscribing_a_group_drops_what_was_not_taken_and_acknowledges_it_after_the_node_has_the_unsub():
    s = connected_session()
    st = s.subscribe(G, None, Mode.RELIABLE)
    s.outgoing(0.0)  # (the SUB's batch leaves)
    s.handle_datagrams(wrap([wire.encode_cmdack(s.session, 1, [0])]), 0.05)
    s.handle_datagrams(wrap([wire.encode_msgs(7, 1, [_group_msg(i) for i in (1, 2, 3)])]), 0.1)
    _acks(s, 0.1)
    s.unsubscribe(G, None)
    assert len(st.queue) == 0
    s.handle_datagrams(wrap([wire.encode_msgs(7, 3, [_group_msg(3)])]), 0.15)  # (a retransmit: needs an ACK)
    (a,) = _acks(s, 0.2)
    assert a[4] == 0  # not yet: the node hands them on when the UNSUB reaches it
    s.handle_datagrams(wrap([wire.encode_cmdack(s.session, 2, [0])]), 0.3)
    (a,) = _acks(s, 0.3)
    assert a[4] == 3


def test_a_cancelled_group_subscription_drops_what_the_node_handed_on():
    s = connected_session()
    st = s.subscribe(G, None, Mode.RELIABLE)
    s.handle_datagrams(wrap([wire.encode_msgs(7, 1, [_group_msg(i) for i in (1, 2, 3)])]), 0.1)
    s.handle_datagrams(wrap([wire.encode_cancel(G, None, "out_of_capacity")]), 0.2)
    assert st.reason == "out_of_capacity" and len(st.queue) == 0


def test_a_plain_subscription_gets_a_group_message_handed_on_to_us_once():
    s = connected_session()
    plain = s.subscribe("jobs", None, Mode.RELIABLE)
    grp = s.subscribe(G, None, Mode.RELIABLE)
    first = wire.pack_delivery("jobs", None, None, b"x", b"p" * 16, 1)  # another member was picked
    again = wire.mark_delivery(first, [wire.mark_id(G, None)])  # it died: the node hands the message to us
    s.handle_datagrams(wrap([wire.encode_msgs(7, 1, [first, again])]), 0.1)
    assert (len(grp.queue), len(plain.queue)) == (1, 1)


def test_a_repeated_sack_run_costs_only_what_is_new_in_it():
    from roost.node.mailbox import Mailbox

    mb = Mailbox(1, 10_000, 0.2, 2.0)
    for i in range(5000):
        mb.push(b"%d" % i)
    mb.take_new(5000, 0.0)
    mb.on_ack(0, [(1, 4000)], 0.1)
    assert mb.sack_run == 4000 and len(mb.sacked) == 4000
    mb.sacked.discard(17)  # (a marker: a run already SACKed is not added again)
    mb.on_ack(0, [(1, 4001)], 0.2)
    assert 17 not in mb.sacked and 4001 in mb.sacked and mb.sack_run == 4001
    mb.on_ack(10, [(11, 4001), (4500, 4600)], 0.3)
    assert mb.sack_run == 4001 and 4550 in mb.sacked
    assert [first for first, _ in mb.runs(5000)] == [17, 4002, 4601]  # (17: the marker)


def test_queue_marks_are_short_ids_so_many_long_group_filters_still_fit_one_datagram():
    """A message of the largest size a client publishes, picked for 20 groups with filters of
    about 800 bytes each: every datagram stays within max_datagram, no copy carries more than
    MAX_MARKS marks, and each group picks exactly one member (review findings 5 and 6)."""
    core = make_core()
    a, b, pub = connect(core, A, B, C)
    v = "v" * 250
    query = " AND ".join([f"kind = '{v}'"] * 3)
    groups = [f"jobs.* queue=g{i} where {query}" for i in range(20)]
    for g in groups:
        a.sub(g)
        b.sub(g)
    limit = 16384 - wire.MESSAGE_ROOM
    bare = len(wire.pack_message("jobs.x", None, {"kind": v}, b""))
    packed = wire.pack_message("jobs.x", None, {"kind": v}, b"p" * (limit - bare - 2))
    wire.check_fits(len(packed), 16384)  # (the largest the client lets through, give or take 2)
    out = pub.send(wire.encode_pub(pub.cid, pub.cookie, pub.pid, 1, 1, True, [packed]), 0.0)
    marks = []
    for addr in (A, B):
        datagrams = [s.data for s in sends(out) if s.addr == addr]
        assert datagrams and all(len(d) <= 16384 for d in datagrams)
        for d in datagrams:
            (m,) = decoding.decode_untrusted_frame(d)[3]
            assert 0 < len(m[-1]) <= wire.MAX_MARKS
            marks += m[-1]
    assert sorted(marks) == sorted(wire.mark_id(g, None) for g in groups)


def test_group_messages_a_node_carries_over_to_a_new_stream_are_not_queued_twice():
    """We moved address within one session: the node starts a new stream and sends again what
    we had not acknowledged. A group's messages we hold untaken stay one copy each, and taking
    them acknowledges them on the new stream (review finding 4)."""
    s = connected_session()
    st = s.subscribe(G, None, Mode.RELIABLE)
    s.handle_datagrams(wrap([wire.encode_msgs(7, 1, [_group_msg(i) for i in (1, 2, 3)])]), 0.1)
    _acks(s, 0.1)
    s.handle_datagrams(wrap([wire.encode_msgs(9, 1, [_group_msg(i) for i in (1, 2, 3, 4)])]), 0.2)
    assert [m.payload for m in st.messages()] == [b"1", b"2", b"3", b"4"]
    (a,) = _acks(s, 0.2)
    assert (a[3], a[4], a[5]) == (9, 0, [(1, 4)])
    for _ in range(4):
        s.consumed(st)
        st.take()
    (a,) = _acks(s, 0.3)
    assert (a[3], a[4], a[5]) == (9, 4, []) and st.holding == {}
