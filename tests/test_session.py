"""The client session alone and together with a core over a faulty fake network."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roost.client import decoding, receive, wire
from roost.client.commands import MAX_BATCH
from roost.client.receive import Message
from roost.client.session import MAX_CANDIDATES, ClientConfig, ClientSession
from roost.client.wire import ErrorCode, FrameType, Mode, Op, Reason
from tests.corekit import NODE, make_core
from tests.simnet import SimNet

SUB = ("127.0.0.1", 6001)
PUB = ("127.0.0.1", 6002)


SESSION = 1_767_225_600_000  # Unix ms, as the shells pass it


def wrap(datagrams):
    return [(d, NODE) for d in datagrams]


def out(s, now):
    return [d for _, d in s.outgoing(now)]


def connected_session(now: float = 0.0, cfg: ClientConfig | None = None) -> ClientSession:
    s = ClientSession(b"c" * 16, b"p" * 16, b"f" * 16, cfg or ClientConfig(), now, node=NODE, session=SESSION)
    s.tick(now)
    (hello,) = out(s, now)
    assert decoding.decode_untrusted_frame(hello)[0] is FrameType.HELLO
    s.handle_datagrams(wrap([wire.encode_welcome("n1", b"k" * 16, {"ping_interval": 0.5}, [])]), now)
    return s


def test_reliable_receive_drops_duplicates_and_reorders():
    s = connected_session()
    st = s.subscribe("t", None, Mode.RELIABLE)
    m = [wire.pack_message("t", None, None, b"%d" % i) for i in range(1, 7)]
    s.handle_datagrams(wrap([wire.encode_msgs(5, 1, m[0:2])]), 0.1)
    s.handle_datagrams(wrap([wire.encode_msgs(5, 5, m[4:6])]), 0.1)  # 3-4 missing
    ack = [f for f in map(decoding.decode_untrusted_frame, out(s, 0.1)) if f[0] is FrameType.ACK][-1]
    assert ack[4] == 2 and ack[5] == [(5, 6)]
    s.handle_datagrams(wrap([wire.encode_msgs(5, 1, m[0:4])]), 0.2)  # retransmit incl. duplicates
    assert [x.payload for x in st.messages()] == [b"1", b"2", b"3", b"4", b"5", b"6"]
    assert [x.sequence for x in st.messages()] == [1, 2, 3, 4, 5, 6]
    assert s.duplicates == 2


def test_new_stream_resets_and_stale_stream_is_ignored():
    s = connected_session()
    st = s.subscribe("t", None, Mode.RELIABLE)
    p = wire.pack_message("t", None, None, b"x")
    s.handle_datagrams(wrap([wire.encode_msgs(5, 1, [p])]), 0.1)
    s.handle_datagrams(wrap([wire.encode_msgs(6, 1, [p])]), 0.1)
    s.handle_datagrams(wrap([wire.encode_msgs(5, 2, [p])]), 0.1)
    assert [(x.sequence) for x in st.messages()] == [1, 1]


def test_node_silence_ends_subscriptions_with_node_lost():
    s = connected_session()
    st = s.subscribe("t", None, Mode.RELIABLE)
    s.tick(1.0)
    assert st.reason is None
    s.tick(1.6)
    assert st.reason == Reason.NODE_LOST and s.lost


def test_command_batches_one_in_flight_and_retried():
    s = connected_session()
    s.subscribe("a", None, Mode.FIRE)
    (first,) = out(s, 0.0)
    s.subscribe("b", None, Mode.FIRE)
    assert out(s, 0.0) == []  # one batch in flight
    s.tick(0.3)
    (again,) = [d for d in out(s, 0.3) if decoding.decode_untrusted_frame(d)[0] is FrameType.CMDS]
    assert again == first  # the same batch id is retried
    s.handle_datagrams(wrap([wire.encode_cmdack(SESSION, 1, [0])]), 0.31)
    (f,) = [f for f in map(decoding.decode_untrusted_frame, out(s, 0.31)) if f[0] is FrameType.CMDS]
    assert f[3:] == (SESSION, 2, [(1, "b", None, 0)])


def test_refused_subscription_has_a_reason():
    s = connected_session()
    st = s.subscribe("a", None, Mode.FIRE)
    out(s, 0.0)
    s.handle_datagrams(wrap([wire.encode_cmdack(SESSION, 1, [10])]), 0.1)
    assert st.reason is not None and st.reason.startswith("refused: overloaded: a limit")
    assert "max_subscriptions_per_host" in st.reason


def test_a_refused_subscription_no_longer_counts_what_it_holds_as_buffered():
    """Messages can come before the CMDACK; when it refuses the subscription, the queue stays
    readable but leaves the buffered count (max_buffered), as an ended one's does: it counted
    for ever before (the receiver's own check, tests/fuzz)."""
    s = connected_session()
    st = s.subscribe("a", None, Mode.FIRE)
    out(s, 0.0)
    s.handle_datagrams(wrap([wire.encode_msgs(0, 7, [wire.pack_message("a", None, None, b"early")])]), 0.05)
    assert s.recv.buffered == 1
    s.handle_datagrams(wrap([wire.encode_cmdack(SESSION, 1, [10])]), 0.1)
    assert (st.reason or "").startswith("refused: overloaded") and [m.payload for m in st.messages()] == [b"early"]
    assert s.recv.buffered == 0


def test_bad_cookie_error_makes_the_session_say_hello_again():
    s = connected_session()
    s.handle_datagrams(wrap([wire.encode_error(wire.ErrorCode.BAD_COOKIE, "x")]), 0.1)
    assert not s.connected
    s.tick(0.1)
    assert decoding.decode_untrusted_frame(out(s, 0.1)[0])[0] is FrameType.HELLO


@pytest.mark.parametrize("seed", range(12))
def test_reliable_end_to_end_over_a_faulty_network(seed):
    """10% loss, 5% duplication, reordering: every message once, in order."""
    core = make_core(retransmit_timeout=0.05, send_window=64, max_datagram=1200)
    net = SimNet(seed, core, loss=0.10, dup=0.05, delay=(0.0005, 0.01))
    cfg = ClientConfig(node_timeout=5.0, pub_retry=0.05, pub_window=128, max_datagram=1200)
    sub, pub = net.add_session(SUB, cfg), net.add_session(PUB, cfg)
    st = sub.subscribe("t", None, Mode.RELIABLE)
    net.run(2.0, stop=lambda: st.confirmed)
    assert st.confirmed
    n = 600
    sent = 0
    while sent < n and net.now < 60:
        while sent < n and not pub.window_full:
            pub.publish("t", None, None, b"%d " % sent + b"x" * 150, True)
            sent += 1
        net.run(net.now + 0.05)
    net.run(net.now + 30, stop=lambda: len(st.queue) >= n)
    assert [m.payload.split()[0] for m in st.messages()] == [b"%d" % i for i in range(n)]
    assert net.dropped > 20 and net.duplicated > 10  # the faults really happened


def test_fire_over_a_lossy_network_loses_but_never_reorders_one_path():
    core = make_core()
    net = SimNet(3, core, loss=0.2, delay=(0.001, 0.001))
    sub, pub = net.add_session(SUB), net.add_session(PUB)
    st = sub.subscribe("t", None, Mode.FIRE)
    net.run(2.0, stop=lambda: st.confirmed)
    for i in range(200):
        pub.publish("t", None, None, b"%d" % i, False)
        net.run(net.now + 0.002)
    net.run(net.now + 0.5)
    got = [int(m.payload) for m in st.messages()]
    assert 0 < len(got) < 200 and got == sorted(got)


def test_out_of_capacity_reaches_the_client_api():
    core = make_core(mailbox_capacity=20, send_window=20)
    net = SimNet(1, core)
    slow = net.add_session(SUB, ClientConfig(max_buffered=5))
    pub = net.add_session(PUB)
    st = slow.subscribe("t", None, Mode.RELIABLE)
    other = slow.subscribe("u", None, Mode.FIRE)
    net.run(1.0, stop=lambda: st.confirmed and other.confirmed)
    for i in range(100):
        pub.publish("t", None, None, b"%d" % i, True)
    net.run(net.now + 3.0, stop=lambda: st.reason is not None)
    assert st.reason == Reason.OUT_OF_CAPACITY
    assert other.reason is None  # the fire subscription carries on
    pub.publish("u", None, None, b"still here", False)
    net.run(net.now + 0.5)
    assert [m.payload for m in other.messages()] == [b"still here"]


def test_forgotten_client_learns_timed_out():
    core = make_core(subscriber_timeout=2.0)
    net = SimNet(1, core)
    s = net.add_session(SUB, ClientConfig(node_timeout=100.0))
    st = s.subscribe("t", None, Mode.RELIABLE)
    net.run(1.0, stop=lambda: st.confirmed)
    net.partitioned.add(SUB)
    net.run(net.now + 4.0)
    net.partitioned.clear()
    net.run(net.now + 2.0)
    assert st.reason == Reason.TIMED_OUT


def test_slow_consumer_and_a_lost_datagram_do_not_stall_the_stream():
    """Messages held behind a full buffer are delivered once the app reads."""
    s = connected_session(cfg=ClientConfig(max_buffered=4))
    st = s.subscribe("t", None, Mode.RELIABLE)
    m = [wire.pack_message("t", None, None, b"%d" % i) for i in range(1, 10)]
    s.handle_datagrams(wrap([wire.encode_msgs(5, 5, m[4:9])]), 0.1)  # 1-4 lost
    s.handle_datagrams(wrap([wire.encode_msgs(5, 1, m[0:4])]), 0.2)  # resent: buffer now full
    got = []
    while st.queue:
        got.append(st.take().payload)
        s.consumed(st)
    assert got == [b"%d" % i for i in range(1, 10)]
    ack = [f for f in map(decoding.decode_untrusted_frame, out(s, 0.3)) if f[0] is FrameType.ACK][-1]
    assert ack[4] == 9 and ack[5] == []


def test_a_late_pong_cannot_cancel_a_renewed_subscription():
    s = connected_session()
    s.subscribe("t", None, Mode.RELIABLE)
    out(s, 0.0)
    s.handle_datagrams(wrap([wire.encode_cmdack(SESSION, 1, [0])]), 0.01)
    # the node cancelled "t"; the client confirmed, then subscribed again (batch 2)
    renewed = s.subscribe("t", None, Mode.RELIABLE)
    out(s, 0.02)
    s.tick(0.6)  # PING token 1 goes out while batch 2 is in flight
    s.handle_datagrams(wrap([wire.encode_cmdack(SESSION, 2, [0])]), 0.61)  # batch 2 applied
    # a PONG generated before the node saw batch 2 still lists the old cancellation
    s.handle_datagrams(wrap([wire.encode_pong(1, True, b"k" * 16, [["t", None, "out_of_capacity"]])]), 0.62)
    assert renewed.reason is None and renewed.confirmed


def test_an_ended_subscription_does_not_keep_the_buffer_full():
    s = connected_session(cfg=ClientConfig(max_buffered=3))
    old = s.subscribe("t", None, Mode.FIRE)
    p = wire.pack_message("t", None, None, b"x")
    s.handle_datagrams(wrap([wire.encode_msgs(0, 0, [p, p, p])]), 0.1)
    s.handle_datagrams(wrap([wire.encode_cancel("t", None, "out_of_capacity")]), 0.1)
    assert old.reason == "out_of_capacity" and len(old.queue) == 3  # still readable
    new = s.subscribe("t", None, Mode.FIRE)
    s.handle_datagrams(wrap([wire.encode_msgs(0, 0, [p])]), 0.2)
    assert len(new.queue) == 1


def cmds_sent(s, now):
    return [f for f in map(decoding.decode_untrusted_frame, out(s, now)) if f[0] is FrameType.CMDS]


def test_batches_carry_the_session_and_count_from_1_within_it():
    for session in (5, 2**63 - 1):
        s = ClientSession(b"c" * 16, b"p" * 16, b"f" * 16, ClientConfig(), 0.0, node=NODE, session=session)
        s.handle_datagrams(wrap([wire.encode_welcome("n1", b"k" * 16, {}, [])]), 0.0)
        ids = []
        for i, topic in enumerate("abc"):
            s.subscribe(topic, None, Mode.FIRE)
            (f,) = cmds_sent(s, i)
            ids.append(f[3:5])
            s.handle_datagrams(wrap([wire.encode_cmdack(session, f[4], [0])]), i)
        assert ids == [(session, 1), (session, 2), (session, 3)]


@pytest.mark.parametrize(
    "ack",
    [
        wire.encode_cmdack(SESSION - 1, 1, [0]),  # meant for our previous process
        wire.encode_cmdack(SESSION + 1, 1, [0]),
        wire.encode_cmdack(SESSION, 2, [0]),  # not the batch in flight
        wire.encode_cmdack(SESSION, 0, [0]),
    ],
    ids=["older session", "newer session", "next batch", "batch 0"],
)
def test_a_cmdack_for_another_session_or_batch_is_ignored(ack):
    s = connected_session()
    st = s.subscribe("a", None, Mode.FIRE)
    (first,) = cmds_sent(s, 0.0)
    s.handle_datagrams(wrap([ack]), 0.1)
    assert not st.confirmed and st.reason is None
    s.tick(0.3)
    assert cmds_sent(s, 0.3) == [first]  # still in flight: retried
    s.handle_datagrams(wrap([wire.encode_cmdack(SESSION, 1, [0])]), 0.4)
    assert st.confirmed


def test_stale_batch_refuses_the_commands_it_carried():
    s = connected_session()
    st = s.subscribe("a", None, Mode.RELIABLE)
    kept = s.subscribe("b", None, Mode.RELIABLE)
    out(s, 0.0)
    s.handle_datagrams(wrap([wire.encode_cmdack(SESSION, 1, [wire.ErrorCode.STALE_BATCH, wire.ErrorCode.OK])]), 0.1)
    assert st.reason == "refused: stale_batch" and ("a", None) not in s.subs
    assert kept.confirmed and kept.reason is None
    assert s.cmds.idle  # nothing retried: the node answered


def test_a_late_message_from_another_member_is_not_taken_for_a_duplicate():
    """n1 delivered 1-2 and died retransmitting 3; the producer moved to n2, which
    delivered 4; n1's 3 then arrives late: it is new, not a duplicate."""
    s = connected_session()
    st = s.subscribe("t", None, Mode.RELIABLE)
    pid = b"P" * 16
    n1, n2 = ("127.0.0.1", 7400), ("127.0.0.1", 7402)
    s.add_candidates([n2])
    d = [wire.pack_delivery("t", None, None, b"m%d" % i, pid, i) for i in range(1, 5)]
    s.handle_datagrams([(wire.encode_msgs(5, 1, d[0:2]), n1)], 0.1)
    s.handle_datagrams([(wire.encode_msgs(9, 1, [d[3]]), n2)], 0.2)
    s.handle_datagrams([(wire.encode_msgs(5, 3, [d[2]]), n1)], 0.3)
    s.handle_datagrams([(wire.encode_msgs(9, 2, [d[2], d[3]]), n2)], 0.4)  # resends: duplicates
    assert [m.payload for m in st.messages()] == [b"m1", b"m2", b"m4", b"m3"]
    assert s.duplicates == 2


@pytest.mark.parametrize(
    "members",
    [[["n2", "127.0.0.1", 70000]], [["n2", "evil.example", 7400]], [["", "127.0.0.1", 7402]],
     [[f"n{i}", "127.0.0.1", 1000 + i] for i in range(65)]],
)  # fmt: skip
def test_a_welcome_with_a_bad_cluster_map_is_ignored_and_counted(members):
    s = ClientSession(b"c" * 16, b"p" * 16, b"f" * 16, ClientConfig(), 0.0, node=NODE)
    bad = wire.pack([wire.VERSION, FrameType.WELCOME, "n1", b"k" * 16, {}, members])
    s.handle_datagrams(wrap([bad]), 0.1)
    assert not s.connected and s.node_id is None
    assert s.candidates == [NODE]
    assert s.bad_datagrams == 1 and ("bad_datagram", len(bad)) in s.events
    s.handle_datagrams(wrap([wire.encode_welcome("n1", b"k" * 16, {}, [["n2", "127.0.0.1", 7402]])]), 0.2)
    assert s.connected and s.candidates == [NODE, ("127.0.0.1", 7402)]


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1e5, allow_nan=False), st.booleans(), st.booleans())
def test_ticking_at_the_deadline_always_moves_it(t0, welcomed, bad_cookie):
    """A deadline tick() does not act on would wake a shell for nothing, forever
    (the simulator found three: a batch retry while the cookie is gone, a
    publish retry with nothing unacknowledged, and node_timeout compared as a
    difference while the deadline is a sum)."""
    s = ClientSession(b"c" * 16, b"p" * 16, b"f" * 16, ClientConfig(), t0, node=NODE, session=SESSION)
    s.subscribe("t", None, Mode.RELIABLE)
    s.publish("t", None, None, b"x", True)
    now = t0
    same = 0
    for step in range(60):
        if step == 1 and welcomed:
            s.handle_datagrams(wrap([wire.encode_welcome("n1", b"k" * 16, {}, [])]), now)
        if step == 3 and bad_cookie:
            s.handle_datagrams(wrap([wire.encode_error(ErrorCode.BAD_COOKIE, "expired")]), now)
        if step == 4:
            s.handle_datagrams(wrap([wire.encode_puback(b"p" * 16, 1)]), now)
        out(s, now)
        d = s.next_deadline()
        assert d >= now
        s.tick(d)
        out(s, d)
        same = same + 1 if s.next_deadline() <= d else 0
        assert same < 2, f"stuck at {d} after step {step}"  # (one immediate follow-up is fine: a failover's HELLO)
        now = d


def test_a_producers_earlier_messages_arriving_after_its_first_one_heard_are_delivered_once():
    """Simulator seed 949: a subscriber's first message from a producer came through one member
    (seq 144) before an earlier one (seq 133) it had accepted through another. Nothing below
    the first sequence heard had been seen: it is new, and delivered, once."""
    from roost.client.receive import Receiver
    from roost.client.session import SubState

    subs: dict[tuple[str, str | None], SubState] = {("t", None): SubState("t", Mode.RELIABLE)}
    r = Receiver(subs, [], ClientConfig())
    pid = b"p" * 16
    for pseq in (144, 133, 150, 133, 144, 140):
        r._deliver(("t", None, None, b"%d" % pseq, pid, pseq), 1, ("127.0.0.1", 1), 1)
    assert [int(m.payload) for m in subs[("t", None)].messages()] == [144, 133, 150, 140]
    assert r.duplicates == 2  # the second 133 and the second 144


def test_a_message_that_arrived_while_no_subscription_was_in_force_is_delivered_when_it_comes_again():
    """Simulator seed 949: a copy reached the client between an unsubscribe and a new
    subscribe to the topic (no application saw it); the copy another member delivered to
    the new subscription was then dropped as a duplicate."""
    from roost.client.receive import Receiver
    from roost.client.session import SubState

    subs: dict[tuple[str, str | None], SubState] = {}
    r = Receiver(subs, [], ClientConfig())
    pid = b"p" * 16
    r._deliver(("t", None, None, b"1", pid, 1), 1, ("127.0.0.1", 1), 1)  # nobody subscribed to t right now
    subs[("t", None)] = SubState("t", Mode.RELIABLE)
    r._deliver(("t", None, None, b"1", pid, 1), 1, ("127.0.0.1", 1), 1)  # the same message, from another member
    r._deliver(("t", None, None, b"1", pid, 1), 2, ("127.0.0.1", 1), 1)  # and a true duplicate
    assert [m.payload for m in subs[("t", None)].messages()] == [b"1"] and r.duplicates == 1


def test_forgetting_early_sequences_past_the_bound_misses_rather_than_duplicates(monkeypatch):
    import roost.client.receive as receive
    from roost.client.receive import Receiver
    from roost.client.session import SubState

    monkeypatch.setattr(receive, "MAX_HOLES", 4)
    subs: dict[tuple[str, str | None], SubState] = {("t", None): SubState("t", Mode.RELIABLE)}
    r = Receiver(subs, [], ClientConfig())
    pid = b"p" * 16
    for pseq in (100, 1, 2, 3, 4, 5, 1):  # 6 early ones: the oldest is forgotten, then repeated
        r._deliver(("t", None, None, b"%d" % pseq, pid, pseq), 1, ("127.0.0.1", 1), 1)
    assert [int(m.payload) for m in subs[("t", None)].messages()] == [100, 1, 2, 3, 4, 5]


def test_a_fire_datagram_the_network_duplicated_is_delivered_once_and_equal_messages_twice():
    from roost.client.receive import Receiver
    from roost.client.session import SubState

    subs: dict[tuple[str, str | None], SubState] = {("t", None): SubState("t", Mode.FIRE)}
    r = Receiver(subs, [], ClientConfig())
    node = ("127.0.0.1", 7400)
    r.on_msgs(node, 0, 41, [("t", None, None, b"x")])
    r.on_msgs(node, 0, 41, [("t", None, None, b"x")])  # the same datagram again (network dup)
    r.on_msgs(node, 0, 42, [("t", None, None, b"x")])  # a new datagram with an equal message
    r.on_msgs(node, 0, 0, [("t", None, None, b"y")])  # unnumbered (an older member): never dropped
    r.on_msgs(node, 0, 0, [("t", None, None, b"y")])
    assert [m.payload for m in subs[("t", None)].messages()] == [b"x", b"x", b"y", b"y"]
    assert r.duplicates == 1


def test_a_publisher_reusing_a_producer_id_the_node_acknowledged_further_sends_only_what_is_new():
    """A retried Spark task publishes under the producer id of the failed attempt: the node's
    PUBACK covers sequences this publisher queued but had not sent yet. They count as delivered
    (the node has them), and what comes after goes out from the next sequence; this used to
    crash emit() with a negative index."""
    from roost.client.publisher import Publisher

    pub = Publisher(b"p" * 16, b"f" * 16, ClientConfig())
    for i in range(3):
        pub.publish("t", None, None, b"%d" % i, True)
    out: list = []
    pub.emit(NODE, b"c" * 16, b"k" * 16, 0.0, out)  # sends 1..3
    for i in range(3, 6):
        pub.publish("t", None, None, b"%d" % i, True)  # 4..6 queued, not sent yet
    assert pub.on_puback(b"p" * 16, 50, 0.1)  # the first attempt got as far as 50
    assert pub.acked == 6 and not pub.unacked
    pub.publish("t", None, None, b"new", True)  # 7
    out = []
    pub.emit(NODE, b"c" * 16, b"k" * 16, 0.2, out)
    [(_, dgram)] = out
    frame = decoding.decode_untrusted_frame(dgram)
    assert frame[0] == FrameType.PUB and frame[4] == 7 and len(frame[7]) == 1  # only the new message, from 7


# ------------------------------------------------------------ the in-order hot path (Receiver._in_order)


def test_an_in_order_datagram_delivers_like_message_by_message_with_duplicates_and_odd_messages():
    """The hot path of a whole in-order datagram gives the same queues, buffered count and
    duplicate count as ``_deliver`` one by one: a repeat of a producer sequence is dropped, a
    jump still goes through ``_duplicate`` (a hole that may be filled later), and a message with
    a key or tags goes through ``_deliver`` in its place in the order."""
    from roost.client.receive import Receiver
    from roost.client.session import SubState

    pid, node = b"p" * 16, ("127.0.0.1", 7400)
    msgs = [("t", None, None, b"1", pid, 1), ("t", None, None, b"2", pid, 2), ("t", None, None, b"2", pid, 2),
            ("t", "k", None, b"k3", pid, 3), ("t", None, {"a": "b"}, b"4", pid, 4), ("u", None, None, b"u5", pid, 5),
            ("t", None, None, b"9", pid, 9), ("t", None, None, b"7", pid, 7)]  # fmt: skip
    queues = []
    for whole_datagram in (True, False):
        subs = {("t", None): SubState("t", Mode.RELIABLE), ("t", "k"): SubState("t", Mode.RELIABLE)}
        r = Receiver(subs, [], ClientConfig())
        if whole_datagram:
            r.on_msgs(node, 1, 1, msgs)
            assert r.streams[node].expected == 1 + len(msgs)
        else:
            for i, m in enumerate(msgs):
                r._deliver(m, 1 + i, node, 1)
        whole, keyed = subs[("t", None)].messages(), subs[("t", "k")].messages()
        queues.append(([(m.payload, m.sequence) for m in whole], [m.payload for m in keyed], r.buffered, r.duplicates))
    assert queues[0] == queues[1]
    assert queues[0] == ([(b"1", 1), (b"2", 2), (b"k3", 4), (b"4", 5), (b"9", 7), (b"7", 8)], [b"k3"], 7, 1)


_PRODUCERS = (b"p" * 16, b"q" * 16)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_PRODUCERS), st.integers(1, 12), st.integers(1, 5),
                          st.sampled_from(["t", "t", "t", "u"]), st.sampled_from([None, None, None, "k"]),
                          st.booleans()), max_size=12),
       st.lists(st.tuples(st.sampled_from(_PRODUCERS), st.integers(1, 12)), max_size=6), st.booleans())  # fmt: skip
def test_the_in_order_path_matches_message_by_message_delivery(runs, before, twice):
    """Property: a whole in-order datagram (``_in_order``: a run of one producer's consecutive
    sequences checked without ``seen``, written once at the run's end) leaves exactly what
    ``_deliver`` one message at a time leaves: the queues, the buffered and duplicate counts,
    and every producer's de-duplication state (``seen``, ``holes``, ``early``), whatever mix
    of producers, runs, repeats, jumps back and forth, keys and tags, after earlier messages
    (and with the same messages again in a second datagram)."""
    from roost.client.receive import Receiver
    from roost.client.session import SubState

    node = ("127.0.0.1", 7400)
    msgs = [(t, k, {"a": "b"} if tagged else None, b"%d" % pseq, pid, pseq)
            for pid, start, n, t, k, tagged in runs for pseq in range(start, start + n)]  # fmt: skip
    datagrams = [msgs, msgs] if twice else [msgs]
    states = []
    for whole_datagram in (True, False):
        subs = {("t", None): SubState("t", Mode.RELIABLE), ("t", "k"): SubState("t", Mode.RELIABLE)}
        r = Receiver(subs, [], ClientConfig())
        for pid, pseq in before:  # (what an earlier stream, or another member, delivered)
            r._duplicate(pid, pseq)
        first = 1
        for d in datagrams:
            if whole_datagram:
                r.on_msgs(node, 1, first, d)
            else:
                for i, m in enumerate(d):
                    r._deliver(m, first + i, node, 1)
            first += len(d)
        holes = {pid: h.ranges() for pid, h in r.holes.items()}
        early = {pid: (e[0], sorted(e[1]), e[2]) for pid, e in r.early.items()}
        for one in subs.values():  # (a sequence beside each payload, none left over)
            assert len(one.seqs) == sum(item.__class__ is bytes for item in one.queue)
        states.append((subs[("t", None)].messages(), subs[("t", "k")].messages(), r.buffered, r.duplicates,
                       r.seen, holes, early))  # fmt: skip
    assert states[0] == states[1]


def test_an_in_order_fire_datagram_is_queued_whole_and_one_past_the_buffer_goes_message_by_message():
    from roost.client.receive import Receiver
    from roost.client.session import SubState

    subs: dict[tuple[str, str | None], SubState] = {("t", None): SubState("t", Mode.FIRE)}
    r = Receiver(subs, [], ClientConfig(max_buffered=3))
    node = ("127.0.0.1", 7400)
    r.on_msgs(node, 0, 1, [("t", None, None, b"a"), ("x", None, None, b"-"), ("t", None, None, b"b")])
    assert [m.payload for m in subs[("t", None)].messages()] == [b"a", b"b"] and r.buffered == 2
    r.on_msgs(node, 0, 2, [("t", None, None, b"c"), ("t", None, None, b"d")])  # room for one: the other dropped
    assert [m.payload for m in subs[("t", None)].messages()] == [b"a", b"b", b"c"] and r.buffered == 3
    assert r.events == [("fire_dropped", 1)]


def test_holes_stay_bounded_and_keep_the_newest_when_a_subscriber_sees_a_sliver_of_a_producer(monkeypatch):
    """A subscriber of one topic in a hundred sees each producer sequence after a jump: every
    jump adds holes. They are trimmed to the newest MAX_HOLES (oldest first, without a sort on
    every message), so a late copy of a recent one is still taken."""
    import roost.client.receive as receive
    from roost.client.receive import Receiver
    from roost.client.session import SubState

    monkeypatch.setattr(receive, "MAX_HOLES", 4)
    subs: dict[tuple[str, str | None], SubState] = {("t", None): SubState("t", Mode.RELIABLE)}
    r = Receiver(subs, [], ClientConfig())
    pid = b"p" * 16
    for pseq in range(1, 40, 3):  # 1, 4, 7, ... each after a jump of 3
        r._deliver(("t", None, None, b"%d" % pseq, pid, pseq), 1, ("127.0.0.1", 1), 1)
        assert len(r.holes.get(pid, ())) <= 4
    r._deliver(("t", None, None, b"38", pid, 38), 1, ("127.0.0.1", 1), 1)  # a recent hole: new
    r._deliver(("t", None, None, b"2", pid, 2), 1, ("127.0.0.1", 1), 1)  # long forgotten: counted as seen
    assert [int(m.payload) for m in subs[("t", None)].messages()][-1] == 38 and r.duplicates == 1


def test_the_common_queued_message_is_its_payload_alone():
    """A subscription's queue holds the common message (its own topic, no key, no tags, in
    order) as its payload alone, its sequence in ``seqs``, and any other as a plain tuple of its
    fields, each made a Message only when taken: bytes are never tracked by the cyclic GC, so a
    subscriber's thousands of queued messages set off no collection (docs/performance.md).
    Mixed, they are taken in the order they came, each with its own sequence."""
    s = connected_session()
    st = s.subscribe("t", None, Mode.RELIABLE)
    ms = [wire.pack_delivery("t", None, None, b"%d" % i, b"p" * 16, i) for i in range(1, 3)]
    s.handle_datagrams(wrap([wire.encode_msgs(5, 1, ms)]), 0.1)
    assert list(st.queue) == [b"1", b"2"] and list(st.seqs) == [1, 2]
    keyed = s.subscribe("t", "k", Mode.RELIABLE)
    mixed = [
        wire.pack_delivery("t", "k", {"a": "b"}, b"3", b"p" * 16, 3),
        wire.pack_delivery("t", None, None, b"4", b"p" * 16, 4),
    ]
    s.handle_datagrams(wrap([wire.encode_msgs(5, 3, mixed)]), 0.2)
    kinds = [item.__class__ for item in (*st.queue, *keyed.queue)]
    assert kinds == [bytes, bytes, tuple, bytes, tuple] and list(st.seqs) == [1, 2, 4]
    assert keyed.messages() == [("t", "k", {"a": "b"}, b"3", 3)]
    wild = s.subscribe("w.*", None, Mode.FIRE)  # (a filter: each message through _deliver, a tuple)
    s.handle_datagrams(wrap([wire.encode_msgs(0, 9, [wire.pack_message("w.x", None, None, b"w")])]), 0.2)
    assert [item.__class__ for item in wild.queue] == [tuple] and wild.messages() == [("w.x", None, None, b"w", None)]
    want = [("t", None, None, b"1", 1), ("t", None, None, b"2", 2), ("t", "k", {"a": "b"}, b"3", 3),
            ("t", None, None, b"4", 4)]  # fmt: skip
    assert st.messages() == want and len(st.queue) == 4  # (looked at, not taken)
    taken = [st.take() for _ in range(4)]
    assert taken == want and all(m.__class__ is Message for m in taken)
    assert not st.queue and not st.seqs
    s.unsubscribe("w.*", None)  # (no filter left: the in-order path again)
    s.handle_datagrams(wrap([wire.encode_msgs(5, 5, [wire.pack_delivery("t", None, None, b"5", b"p" * 16, 5)])]), 0.3)
    assert list(st.seqs) == [5]
    s.unsubscribe("t", None)
    assert not st.queue and not st.seqs  # (both emptied together)


@pytest.mark.parametrize(("asked", "kept"), [(0.2, 0.2), (0.5, 0.5), (30.0, 0.5)])
def test_a_welcome_cannot_set_a_ping_interval_past_a_third_of_node_timeout(asked, kept):
    """A WELCOME asking for pings further apart than node_timeout allows (spoofed, or a node
    configured apart) would make the client call a well node lost between two pings."""
    s = ClientSession(b"c" * 16, b"p" * 16, b"f" * 16, ClientConfig(node_timeout=1.5), 0.0, node=NODE, session=SESSION)
    s.tick(0.0)
    out(s, 0.0)
    s.handle_datagrams(wrap([wire.encode_welcome("n1", b"k" * 16, {"ping_interval": asked}, [])]), 0.0)
    assert s.connected and s.ping_interval == pytest.approx(kept)


# ------------------------------------------------------------ datagrams spoofed from the node's address


def test_a_pong_answering_no_ping_we_sent_ends_nothing():
    s = connected_session()
    st = s.subscribe("t", None, Mode.RELIABLE)
    out(s, 0.0)
    s.handle_datagrams(wrap([wire.encode_cmdack(SESSION, 1, [0])]), 0.1)
    assert st.confirmed
    s.handle_datagrams(wrap([wire.encode_pong(2**40, False, b"z" * 16, [["t", None, "out_of_capacity"]], 0)]), 0.2)
    assert st.reason is None and s.subs
    s.tick(1.0)  # (our PING: its PONG is taken)
    token = s.ping_token
    s.handle_datagrams(wrap([wire.encode_pong(token, False, b"z" * 16, [], 0)]), 1.1)
    assert st.reason == "timed_out"


def test_cancels_of_subscriptions_we_do_not_hold_queue_an_unsub_once_each_and_never_past_a_batch():
    s = connected_session()
    s.cmds.inflight = (s.cmds.next_batch, [])  # (a batch in flight: the queue waits, as on a lossy path)
    for i in range(3 * MAX_BATCH):
        s.handle_datagrams(wrap([wire.encode_cancel(f"x{i % (2 * MAX_BATCH)}", None, "out_of_capacity")]), 0.1)
    assert len(s.cmds.queued) == MAX_BATCH
    s.cmds.queued.clear()
    s.handle_datagrams(wrap([wire.encode_cancel("y", None, "out_of_capacity")] * 3), 0.2)
    assert s.cmds.queued == [(Op.UNSUB, "y", None, Mode.FIRE)]


def test_a_cmdack_without_one_result_per_command_is_not_taken():
    s = connected_session()
    st = s.subscribe("u", None, Mode.RELIABLE)
    out(s, 0.0)
    s.handle_datagrams(wrap([wire.encode_cmdack(SESSION, 1, [])]), 0.1)
    assert s.cmds.inflight is not None and not st.confirmed  # (still in flight: sent again)
    s.handle_datagrams(wrap([wire.encode_cmdack(SESSION, 1, [0])]), 0.2)
    assert st.confirmed and s.cmds.inflight is None


def test_welcomes_cannot_grow_the_addresses_a_session_hears_from_without_end():
    s = connected_session()
    for i in range(200):
        members = [[f"m{j}", f"10.{i}.0.{j}", 1000 + j] for j in range(16)]
        s.handle_datagrams(wrap([wire.encode_welcome("n1", b"k" * 16, {}, members)]), 0.0)
    assert len(s.candidates) == MAX_CANDIDATES and s.candidates[0] == NODE
    assert set(s.candidates) == s._known and ("10.199.0.15", 1015) in s._known  # (the newest kept)


def test_msgs_naming_new_producers_cannot_grow_the_receivers_memory_without_end(monkeypatch):
    monkeypatch.setattr(receive, "MAX_PRODUCERS", 100)
    s = connected_session()
    st = s.subscribe("t", None, Mode.RELIABLE)
    for i in range(300):
        d = wire.encode_msgs(1, i + 1, [wire.pack_delivery("t", None, None, b"x", i.to_bytes(16, "big"), 2**40)])
        s.handle_datagrams(wrap([d]), 0.0)
    assert len(s.recv.seen) == 100 and len(s.recv.early) == 100 and len(st.queue) == 300


def test_a_map_from_the_address_of_a_node_that_announced_none_is_not_taken():
    """A single node sends no cluster map: a REDIRECT from its address (spoofed) would route the
    client's subscriptions and publishes to the addresses it names."""
    from roost.client import clustermap

    two = {"n1": (NODE, ("127.0.0.1", 7500)), "x": (("203.0.113.66", 7400), ("203.0.113.66", 7500))}
    cmap = clustermap.encode(clustermap.compute(2**40, two, two, 16, 2))
    s = connected_session()
    s.handle_datagrams(wrap([wire.encode_redirect("n1", cmap)]), 0.1)
    assert s.cmap is None and ("203.0.113.66", 7400) not in s.candidates
    s.handle_datagrams(wrap([wire.encode_welcome("n1", b"k" * 16, {"ping_interval": 0.5, "map_epoch": 1}, [])]), 0.2)
    s.handle_datagrams(wrap([wire.encode_redirect("n1", cmap)]), 0.3)  # (a partitioned member's: taken)
    assert s.cmap is not None and s.cmap.epoch == 2**40


def test_close_sends_the_acks_not_sent_yet_then_bye_and_nothing_before_a_welcome():
    s = ClientSession(b"c" * 16, b"p" * 16, b"f" * 16, ClientConfig(), 0.0, node=NODE, session=SESSION)
    assert s.close() == []
    s = connected_session()
    s.subscribe("t", None, Mode.RELIABLE)
    out(s, 0.0)
    s.handle_datagrams(wrap([wire.encode_cmdack(SESSION, 1, [0])]), 0.1)
    s.handle_datagrams(wrap([wire.encode_msgs(7, 1, [wire.pack_message("t", None, None, b"x")])]), 0.2)
    got = [decoding.decode_untrusted_frame(d) for _, d in s.close()]
    assert [f[0] for f in got] == [FrameType.ACK, FrameType.BYE] and got[0][3:5] == (7, 1)


def test_the_producer_forgotten_first_is_the_one_heard_from_least_recently(monkeypatch):
    """A long-lived producer still heard from is remembered; short-lived ones heard since go."""
    monkeypatch.setattr(receive, "MAX_PRODUCERS", 4)
    s = connected_session()
    st = s.subscribe("t", None, Mode.RELIABLE)
    P = b"P" * 16

    def msgs(stream: int, seq: int, items: list[tuple[bytes, int, bytes]]) -> bytes:
        return wire.encode_msgs(stream, seq, [wire.pack_delivery("t", None, None, p, pid, q) for pid, q, p in items])

    s.handle_datagrams(wrap([msgs(1, 1, [(P, 1, b"p1"), (P, 2, b"p2"), (P, 3, b"p3")])]), 0.1)
    for i in range(4):  # (four short-lived producers heard since, P among them)
        s.handle_datagrams(
            wrap([msgs(1, 4 + 2 * i, [(bytes([i]) * 16, 1, b"o%d" % i), (P, 4 + i, b"p%d" % (4 + i))])]), 0.2
        )
    assert P in s.recv.seen and len(s.recv.seen) == 4
    s.handle_datagrams(wrap([msgs(9, 1, [(P, 3, b"p3"), (P, 7, b"p7")])]), 0.4)  # (a failover's resend)
    assert [m.payload for m in st.messages()].count(b"p3") == 1


def test_take_events_returns_what_happened_once_and_leaves_the_list_the_receiver_shares():
    s = connected_session()
    shared = s.events
    assert s.take_events() == [("connected", "n1")] and s.take_events() == []
    s.handle_datagrams(wrap([wire.encode_cmdack(SESSION, 99, [0])]), 0.1)  # (no batch in flight: nothing)
    s.subscribe("t", None, Mode.FIRE)
    out(s, 0.2)
    s.handle_datagrams(wrap([wire.encode_cmdack(SESSION, 1, [0])]), 0.3)
    assert s.take_events() == [("cmdack", 1)] and s.events is shared and s.recv.events is shared
