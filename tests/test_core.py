"""The broker core driven directly: fake time, no sockets."""

from __future__ import annotations

import itertools

import pytest

from roost.client import decoding, wire
from roost.client.text import parse_untrusted_text
from roost.client.wire import ErrorCode, FrameType, Mode, Reason
from roost.node.actions import Log
from tests.corekit import PAD, connect, delivered, frames_to, make_core, sends

A = ("127.0.0.1", 5001)
B = ("127.0.0.1", 5002)
C = ("127.0.0.1", 5003)
D = ("127.0.0.1", 5004)
E_ = ("127.0.0.1", 5005)
FAR = ("203.0.113.9", 6000)  # not on a text network


def text(core, data: bytes, addr=A, now=0.0):
    return core.handle_datagrams([(data, addr)], now)


def test_text_sub_pub_delivers_exact_bytes():
    core = make_core()
    assert sends(text(core, b"SUB t1\n")) == []
    out = sends(text(core, b"PUB t1\nhello world  ", addr=B))
    assert [(s.addr, s.data) for s in out] == [(A, b"MSG t1\nhello world  ")]


def test_text_subscribing_twice_delivers_once_and_unsub_stops():
    core = make_core()
    text(core, b"SUB t1\n")
    text(core, b"SUB\tt1 \n")
    assert [s.data for s in sends(text(core, b"PUB t1 x", addr=B))] == [b"MSG t1\nx"]
    text(core, b"UNSUB t1\n")
    assert sends(text(core, b"PUB t1 x", addr=B)) == []
    assert core.index.count == 0 and core.text_subs == 0


def test_text_order_of_one_publisher_is_kept():
    core = make_core()
    text(core, b"SUB t\n" + PAD)
    out = core.handle_datagrams([(f"PUB t\n{i}".encode(), B) for i in range(50)], 0.0)
    assert [s.data for s in sends(out)] == [f"MSG t\n{i}".encode() for i in range(50)]


def test_text_errors_are_replied_and_change_nothing():
    core = make_core()
    cases = {
        b"SUB t1": "malformed",
        b"FOO t1\n": "unknown_verb",
        b"MSG t1\nx": "unknown_verb",
        b"PUB t1\n\xff\xfe": "bad_utf8",
        b"SUB " + b"x" * 256 + b"\n": "bad_topic",
    }
    for data, code in cases.items():
        before = core.state_digest()
        (reply,) = sends(text(core, data))
        assert reply.data.startswith(f"ERR {code} ".encode()), (data, reply.data)
        assert core.state_digest() == before


def test_text_from_untrusted_network_is_refused_silently():
    core = make_core()
    assert sends(text(core, b"SUB t1\n", addr=FAR)) == []
    assert core.index.count == 0
    assert core.metrics["error_forbidden"] == 1


def test_oversized_datagram_gets_too_large():
    core = make_core(max_datagram=2000)
    (reply,) = sends(text(core, b"PUB t " + b"x" * 2000))
    assert reply.data.startswith(b"ERR too_large")
    (fc,) = connect(core, B)
    (f,) = frames_to(fc.send(b"\x93" + b"\x01" * 2100, 0.0), B)
    assert f[0] is FrameType.ERROR and f[1] == ErrorCode.TOO_LARGE


def test_text_lease_expires_unless_renewed():
    core = make_core(text_sub_lease=5.0)
    text(core, b"SUB t\n", now=0.0)
    text(core, b"SUB t\n", now=4.0)  # renew
    core.tick(6.0)
    assert core.index.count == 1
    core.tick(9.5)
    assert core.index.count == 0 and core.text_subs == 0


def test_text_subscription_with_lease_off_never_expires():
    core = make_core(text_sub_lease=0)
    text(core, b"SUB t\n")
    core.tick(10_000.0)
    assert core.index.count == 1


def test_welcome_cookie_then_reliable_delivery_in_order():
    core = make_core()
    sub, pub = connect(core, A, B)
    (ack,) = frames_to(sub.sub("t"), A)
    assert ack[0] is FrameType.CMDACK and ack[1:] == (1, 1, [0])
    out = pub.pub([("t", f"m{i}".encode()) for i in range(10)])
    got = delivered(out, A)
    assert [p for _, _, p in got] == [f"m{i}".encode() for i in range(10)]
    assert [s for _, s, _ in got] == list(range(1, 11))
    (puback,) = frames_to(out, B)
    assert puback[0] is FrameType.PUBACK and puback[2] == 10


def test_many_messages_are_batched_into_few_datagrams():
    core = make_core()
    sub, pub = connect(core, A, B)
    sub.sub("t")
    out = pub.pub([("t", b"x" * 100) for _ in range(100)])
    msgs_frames = [f for f in frames_to(out, A) if f[0] is FrameType.MSGS]
    assert len(msgs_frames) == 1 and len(msgs_frames[0][3]) == 100


def test_retransmit_after_timeout_until_acked():
    core = make_core(retransmit_timeout=0.2)
    sub, pub = connect(core, A, B)
    sub.sub("t")
    first = delivered(pub.pub([("t", b"a"), ("t", b"b")]), A)
    stream = first[0][0]
    assert delivered(core.tick(0.1), A) == []
    again = delivered(core.tick(0.25), A)
    assert again == first
    sub.ack(stream, 2, now=0.3)
    assert delivered(core.tick(5.0), A) == []


def test_retransmission_backs_off():
    core = make_core(retransmit_timeout=0.1, retransmit_max=0.4)
    sub, pub = connect(core, A, B)
    sub.sub("t")
    pub.pub([("t", b"a")])
    times = []
    t = 0.0
    while t < 2.0:
        t = round(t + 0.01, 2)
        if delivered(core.tick(t), A):
            times.append(t)
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(times)]
    assert times[0] == 0.1
    assert all(abs(g - want) <= 0.011 for g, want in zip(gaps, [0.2, 0.4, 0.4, 0.4], strict=False))
    assert len(gaps) >= 4


def test_sack_triggers_fast_retransmit_of_holes_only():
    core = make_core()
    sub, pub = connect(core, A, B)
    sub.sub("t")
    got = delivered(pub.pub([("t", bytes([i])) for i in range(1, 7)]), A)
    stream = got[0][0]
    # the client got 1-2 and 5-6: holes 3 and 4
    again = delivered(sub.ack(stream, 2, [[5, 6]], now=0.01), A)
    assert [s for _, s, _ in again] == [3, 4]


def test_window_limits_messages_in_flight():
    core = make_core(send_window=4)
    sub, pub = connect(core, A, B)
    sub.sub("t")
    got = delivered(pub.pub([("t", bytes([i])) for i in range(10)]), A)
    assert [s for _, s, _ in got] == [1, 2, 3, 4]
    got = delivered(sub.ack(got[0][0], 4, now=0.01), A)
    assert [s for _, s, _ in got] == [5, 6, 7, 8]


def test_out_of_capacity_cancels_reliable_and_spares_others():
    core = make_core(mailbox_capacity=16, send_window=16)
    slow, fast, pub = connect(core, A, B, C)
    slow.sub("t")
    slow.sub("other", mode=Mode.FIRE)
    fast.sub("t")
    fast_stream = None
    cancelled = []
    for i in range(40):
        out = pub.pub([("t", b"%d" % i)], now=i * 0.01)
        cancelled += [f for f in frames_to(out, A) if f[0] is FrameType.CANCEL]
        for stream, seq, _ in delivered(out, B):
            fast_stream = stream
            fast.ack(stream, seq, now=i * 0.01)
        # the publisher is never refused
        assert [f[0] for f in frames_to(out, C)] == [FrameType.PUBACK]
    assert [(f[1], f[3]) for f in cancelled] == [("t", Reason.OUT_OF_CAPACITY)]
    assert fast_stream is not None
    assert core.clients[slow.cid].modes() == {("other", None): Mode.FIRE}
    # the cancellation is repeated in PONG until the client confirms it
    (pong,) = frames_to(slow.ping(1.0), A)
    assert pong[4] == [("t", None, Reason.OUT_OF_CAPACITY)]
    slow.cmds([(0, "t", None, 0)], now=1.0)
    (pong,) = frames_to(slow.ping(1.1, token=2), A)
    assert pong[4] == []


def _fan_out_20(as_run: bool):
    """What each kind of subscriber of "t" gets from one PUB of 20 reliable messages of "t": a
    reliable subscriber whose mailbox holds 16, a fire one, a text one. Unless ``as_run``, an
    unrelated wildcard subscription makes the node take the messages one at a time."""
    core = make_core(mailbox_capacity=16, send_window=64)
    rel, fire, pub, other = connect(core, A, B, C, E_)
    rel.sub("t")
    fire.sub("t", mode=Mode.FIRE)
    text(core, b"SUB t\n" + PAD, addr=D)
    if not as_run:
        other.sub("x.>")
    out = pub.pub([("t", b"%d" % i) for i in range(20)])
    cancels = [(f[1], f[3]) for f in frames_to(out, A) if f[0] is FrameType.CANCEL]
    texts = [s.data for s in sends(out) if s.addr == D]
    return delivered(out, A), cancels, delivered(out, B), texts, dict(core.index.matched), core.state_digest()


def test_a_datagram_of_one_topic_fans_out_as_a_run_like_one_message_at_a_time():
    """A publisher's datagram of one topic goes to each subscriber in one call (the node's
    ``_publish_run``); what every subscriber gets, and when a full mailbox cancels, is the same
    as when the node takes the messages one at a time (``_publish``)."""
    run = _fan_out_20(as_run=True)
    each = _fan_out_20(as_run=False)
    got_rel, cancels, got_fire, texts, matched, _ = run
    assert got_rel == []  # (the 17th overflowed the mailbox: its messages were discarded)
    assert cancels == [("t", Reason.OUT_OF_CAPACITY)]
    assert [p for _, _, p in got_fire] == [b"%d" % i for i in range(20)]
    assert texts == [b"MSG t\n%d" % i for i in range(20)]
    assert matched == {"t": 20}
    assert run[:5] == each[:5]


def _overflow_beside_fire(as_run: bool):
    """A client with a reliable subscription to "t" and a fire one to "t" with key "k", whose
    mailbox holds 16, and one PUB of 20 messages of ("t", "k") (review finding: the run once
    matched them once and dropped what followed the overflow)."""
    core = make_core(mailbox_capacity=16, send_window=64)
    a, pub, other = connect(core, A, C, E_)
    a.cmds([(1, "t", None, Mode.RELIABLE), (1, "t", "k", Mode.FIRE)])
    if not as_run:
        other.sub("x.>")
    packed = [wire.pack_message("t", "k", None, b"%d" % i) for i in range(20)]
    out = pub.send(wire.encode_pub(pub.cid, pub.cookie, pub.pid, 1, 1, True, packed), 0.0)
    cancels = [(f[1], f[3]) for f in frames_to(out, A) if f[0] is FrameType.CANCEL]
    return delivered(out, A), cancels, dict(core.index.matched), core.metrics["delivered"]


def test_after_a_mailbox_overflows_the_clients_fire_subscription_takes_the_rest_of_the_datagram():
    run, each = _overflow_beside_fire(as_run=True), _overflow_beside_fire(as_run=False)
    got, cancels, matched, _ = run
    assert [(s, p) for s, _, p in got] == [(0, b"17"), (0, b"18"), (0, b"19")]  # (by fire)
    assert cancels == [("t", Reason.OUT_OF_CAPACITY)] and matched == {"t": 20}
    assert run == each


def test_mailbox_fits_a_run_up_to_its_capacity_and_bytes():
    from roost.node.mailbox import Mailbox

    mb = Mailbox(1, capacity=4, rto=0.2, rto_max=1.0, max_bytes=100)
    assert mb.push(b"x" * 10)
    assert mb.fits(3, 90) and not mb.fits(4, 40) and not mb.fits(3, 91)
    mb.push_many([b"y" * 30] * 3, 90)
    assert len(mb) == 4 and mb.nbytes == 100 and not mb.fits(1, 0) and not mb.push(b"z")


def test_a_run_fills_a_mailbox_to_its_capacity_exactly():
    core = make_core(mailbox_capacity=16, send_window=64)
    sub, pub = connect(core, A, B)
    sub.sub("t")
    got = delivered(pub.pub([("t", b"%d" % i) for i in range(16)]), A)
    assert [(s, p) for _, s, p in got] == [(i + 1, b"%d" % i) for i in range(16)]
    assert [f for f in frames_to(pub.pub([("t", b"x")] * 2), A) if f[0] is FrameType.CANCEL]


def test_resubscribe_after_cancel_starts_a_new_stream():
    core = make_core(mailbox_capacity=16, send_window=16)
    sub, pub = connect(core, A, B)
    sub.sub("t")
    first_stream = delivered(pub.pub([("t", b"x")]), A)[0][0]
    pub.pub([("t", b"x")] * 20)
    sub.sub("t")
    got = delivered(pub.pub([("t", b"y")]), A)
    assert got[0][0] > first_stream and got[0][1] == 1


def test_silent_subscriber_is_dropped_after_timeout():
    core = make_core(subscriber_timeout=3.0, ping_interval=0.5)
    sub, pub = connect(core, A, B)
    sub.sub("t")
    for t in (1.0, 2.0, 3.0, 4.0):
        sub.ping(t)
        core.tick(t)
    assert sub.cid in core.clients
    core.tick(7.5)
    assert sub.cid not in core.clients and core.index.count == 0
    assert delivered(pub.pub([("t", b"x")], now=8.0), A) == []
    (pong,) = frames_to(sub.ping(8.0), A)
    assert pong[2] is False  # the client learns it was forgotten


def test_bye_drops_the_client_at_once_and_logs_client_closed():
    core = make_core(subscriber_timeout=3.0, ping_interval=0.5)
    sub, pub = connect(core, A, B)
    sub.sub("t")
    sub.sub("u", mode=0)
    out = sub.send(wire.encode_bye(sub.cid, sub.cookie, sub.session), 1.0)
    assert sends(out) == []  # (a BYE is not answered)
    assert [(a.event, a.fields["subs"]) for a in out if isinstance(a, Log)] == [("client_closed", 2)]
    assert sub.cid not in core.clients and core.index.count == 0
    assert core.metrics["clients_closed"] == 1
    assert delivered(pub.pub([("t", b"x")], now=1.5), A) == []
    later = core.tick(20.0)  # nothing is left to time out
    assert [a.event for a in later if isinstance(a, Log)] == []
    assert core.metrics["clients_timed_out"] == 0


def test_a_bye_of_another_session_or_with_a_bad_cookie_changes_nothing():
    core = make_core()
    sub, intruder = connect(core, A, B)
    sub.sub("t")
    before = core.state_digest()
    stale = sub.send(wire.encode_bye(sub.cid, sub.cookie, sub.session + 1), 1.0)  # (not this process's)
    forged = core.handle_datagrams([(wire.encode_bye(sub.cid, intruder.cookie, sub.session), B)], 1.0)
    assert core.state_digest() == before and core.metrics["bye_ignored"] == 1
    assert [f[:2] for f in frames_to(forged, B)] == [(FrameType.ERROR, ErrorCode.BAD_COOKIE)]
    assert [a for a in stale if isinstance(a, Log)] == []
    assert delivered(intruder.pub([("t", b"x")], now=2.0), A) != []
    # a publisher's BYE (it has no record here) is the normal end of a run: not counted as ignored
    out = intruder.send(wire.encode_bye(intruder.cid, intruder.cookie, intruder.session), 3.0)
    assert sends(out) == [] and core.metrics["bye_ignored"] == 1 and intruder.cid not in core.clients


def test_cannot_subscribe_another_address():
    core = make_core()
    victim, attacker = connect(core, A, B)
    # The attacker reuses its own valid cookie from a spoofed source address...
    spoofed = wire.encode_cmds(attacker.cid, attacker.cookie, 1, 1, [(1, "t", None, 1)])
    out = core.handle_datagrams([(spoofed, A)], 0.0)
    # ...or the victim's client id with its own cookie.
    forged = wire.encode_cmds(victim.cid, attacker.cookie, 1, 1, [(1, "t", None, 1)])
    out += core.handle_datagrams([(forged, B)], 0.0)
    assert core.clients == {} and core.index.count == 0
    errors = [*frames_to(out, A), *frames_to(out, B)]
    assert [(f[0], f[1]) for f in errors] == [(FrameType.ERROR, ErrorCode.BAD_COOKIE)] * 2
    assert delivered(core.handle_datagrams([(b"PUB t\nboom", C)], 0.0), A) == []


def test_unvalidated_sources_never_get_more_than_3x():
    core = make_core()
    probes = [wire.encode_hello(b"x" * 16), b"\x93\x01\x03\x01", b"\x01", b"\x9f" * 7,
              wire.encode_cmds(b"a" * 16, b"b" * 16, 1, 1, [(1, "t", None, 1)])]  # fmt: skip
    for data in probes:
        out = core.handle_datagrams([(data, FAR)], 0.0)
        assert sum(len(s.data) for s in sends(out)) <= 3 * len(data)
    assert core.metrics["dropped_amplification"] >= 2


def test_short_hello_gets_no_welcome():
    core = make_core()
    short = wire.pack([1, FrameType.HELLO, b"x" * 16, b""])
    assert sends(core.handle_datagrams([(short, FAR)], 0.0)) == []


def test_command_batch_retry_does_not_undo_later_commands():
    core = make_core()
    (fc,) = connect(core, A)
    sub_batch = fc.cmds_frame(1, [(1, "t", None, 1)])
    unsub_batch = fc.cmds_frame(2, [(0, "t", None, 0)])
    fc.send(sub_batch, 0.0)
    fc.send(unsub_batch, 0.0)
    (ack,) = frames_to(fc.send(sub_batch, 0.1), A)  # late duplicate of batch 1
    assert ack[0] is FrameType.CMDACK and ack[1:] == (fc.session, 1, [ErrorCode.OK])
    assert core.index.count == 0


def test_commands_in_a_batch_apply_in_order_last_wins():
    core = make_core()
    (fc,) = connect(core, A)
    fc.cmds([(1, "t", None, 1), (0, "t", None, 0), (1, "t", None, 0), (1, "t", "k", 1)])
    assert core.clients[fc.cid].modes() == {("t", None): Mode.FIRE, ("t", "k"): Mode.RELIABLE}


def test_keyed_and_whole_topic_subscriptions():
    core = make_core()
    whole, keyed, pub = connect(core, A, B, C)
    whole.sub("actors")
    keyed.sub("actors", key="a1")
    keyed.sub("actors")  # also the whole topic: still one copy per message
    packed = [wire.pack_message("actors", k, {"kind": "x"}, b"p") for k in ("a1", "a2")]
    out = pub.send(wire.encode_pub(pub.cid, pub.cookie, pub.pid, 1, 1, True, packed), 0.0)
    assert len(delivered(out, A)) == 2
    assert len(delivered(out, B)) == 2
    keyed.cmds([(0, "actors", None, 0)])
    out = pub.send(wire.encode_pub(pub.cid, pub.cookie, pub.pid, 3, 3, True, packed), 0.0)
    (f,) = [f for f in frames_to(out, B) if f[0] is FrameType.MSGS]
    assert [(m[1], m[2]) for m in f[3]] == [("a1", {"kind": "x"})]


def test_publisher_retries_are_deduplicated():
    core = make_core()
    sub, pub = connect(core, A, B)
    sub.sub("t")
    packed = [wire.pack_message("t", None, None, b"%d" % i) for i in range(3)]
    data = wire.encode_pub(pub.cid, pub.cookie, pub.pid, 1, 1, True, packed)
    assert len(delivered(pub.send(data, 0.0), A)) == 3
    out = pub.send(data, 0.1)  # the PUBACK was lost; the producer resends
    assert delivered(out, A) == []
    assert [f[2] for f in frames_to(out, B) if f[0] is FrameType.PUBACK] == [3]
    # an overlapping batch delivers only its new part
    more = [*packed, wire.pack_message("t", None, None, b"3")]
    out = pub.send(wire.encode_pub(pub.cid, pub.cookie, pub.pid, 1, 1, True, more), 0.2)
    assert [p for _, _, p in delivered(out, A)] == [b"3"]


def test_reliable_publish_gap_is_refused_to_keep_order():
    core = make_core()
    sub, pub = connect(core, A, B)
    sub.sub("t")
    later = wire.encode_pub(pub.cid, pub.cookie, pub.pid, 3, 1, True, [wire.pack_message("t", None, None, b"c")])
    out = pub.send(later, 0.0)
    assert delivered(out, A) == []
    assert [f[2] for f in frames_to(out, B)] == [0]


def test_client_moving_address_keeps_subscriptions():
    core = make_core()
    fc, pub = connect(core, A, B)
    fc.sub("t")
    fc.addr = C  # NAT rebinding: same client id, new address
    fc.hello()
    fc.ping(0.5)
    assert core.clients[fc.cid].addr == C
    assert delivered(pub.pub([("t", b"x")], now=0.6), C)


def test_text_and_binary_subscribers_share_topics():
    core = make_core()
    (fc,) = connect(core, A)
    fc.sub("t", mode=Mode.FIRE)
    text(core, b"SUB t\n" + PAD, addr=B)
    out = text(core, b"PUB t\nhi there", addr=C)
    assert delivered(out, A) == [(0, 0, b"hi there")]
    assert [s.data for s in sends(out) if s.addr == B] == [b"MSG t\nhi there"]
    (pub,) = connect(core, C)
    out = pub.pub([("t", b"bin")])
    assert [s.data for s in sends(out) if s.addr == B] == [b"MSG t\nbin"]


def test_limits_answer_overloaded():
    core = make_core(max_subscriptions_per_client=2)
    (fc,) = connect(core, A)
    (ack,) = frames_to(fc.cmds([(1, "a", None, 0), (1, "b", None, 0), (1, "c", None, 0)]), A)
    assert ack[3] == [0, 0, ErrorCode.OVERLOADED]
    core2 = make_core(max_clients=1)
    x, y = connect(core2, A, B)
    x.sub("t")
    (err,) = frames_to(y.sub("t"), B)
    assert err[0] is FrameType.ERROR and err[1] == ErrorCode.OVERLOADED
    core3 = make_core(max_text_subscribers=1)
    text(core3, b"SUB a\n")
    (reply,) = sends(text(core3, b"SUB b\n"))
    assert reply.data.startswith(b"ERR over_capacity") and core3.text_subs == 1


def test_producer_state_expires():
    core = make_core(producer_timeout=10.0)
    (pub,) = connect(core, B)
    pub.pub([("t", b"x")], now=0.0)
    core.tick(5.0)
    assert pub.pid in core.producers
    core.tick(10.5)
    assert pub.pid not in core.producers


def test_text_parse_splits_verb_topic_and_body():
    assert parse_untrusted_text(b"PUB t1\n  body  ") == ("PUB", "t1", "body  ")
    assert parse_untrusted_text(b"SUB t1\n") == ("SUB", "t1", "")
    assert parse_untrusted_text(b"PUB\t\tt1 a b\n c") == ("PUB", "t1", "a b\n c")
    assert parse_untrusted_text(b"PUB t1 \r\n\x0b\x0cx") == ("PUB", "t1", "x")


def _trigger(core, code):
    """A datagram (and source) that must make the node answer with ``code``."""
    import msgpack

    (fc,) = connect(core, B)
    cid, ck = fc.cid, fc.cookie
    bad_msg = lambda m: wire.pack([1, FrameType.PUB, cid, ck, fc.pid, 1, 1, True, [m]])  # noqa: E731
    if code is ErrorCode.OVER_CAPACITY:
        text(core, b"SUB first\n", addr=C)  # (the node's one subscription: it is full)
    return {
        ErrorCode.MALFORMED: (b"\x93\x01", B),
        ErrorCode.UNSUPPORTED_VERSION: (msgpack.packb([9, 1]), B),
        ErrorCode.UNKNOWN_TYPE: (wire.encode_msgs(1, 1, [wire.pack_message("t", None, None, b"")]), B),
        ErrorCode.TOO_LARGE: (b"PUB t " + b"x" * 70000, B),
        ErrorCode.BAD_COOKIE: (wire.encode_ping(cid, b"0" * 16, 1), B),
        ErrorCode.BAD_TOPIC: (b"SUB " + b"t" * 300 + b"\n", B),
        ErrorCode.BAD_UTF8: (b"PUB t \xff", B),
        ErrorCode.UNKNOWN_VERB: (b"GET t\n", B),
        ErrorCode.FORBIDDEN: (b"SUB t\n", FAR),
        ErrorCode.OVERLOADED: (wire.encode_cmds(cid, ck, 1, 1, [(1, "t", None, 0)]), B),
        ErrorCode.BAD_KEY: (bad_msg(["t", "", None, b""]), B),
        ErrorCode.BAD_MODE: (wire.pack([1, FrameType.CMDS, cid, ck, 1, 1, [[1, "t", None, 5]]]), B),
        ErrorCode.BAD_TAGS: (bad_msg(["t", None, {"a": 1}, b""]), B),
        ErrorCode.OVER_CAPACITY: (b"SUB second\n", A),
    }[code]


@pytest.mark.parametrize("reliable", [True, False], ids=["reliable", "fire"])
def test_a_pub_whose_last_sequence_passes_2_63_is_refused_and_the_node_goes_on(reliable):
    """Review finding: sequences up to 2**64 - 1 each passed, but a PUB's last one (first +
    messages - 1) past it made the node raise OverflowError packing a delivery or a PUBACK,
    which no handler caught. Sequences now stay below 2**63 (wire.SEQ_LIMIT)."""
    core = make_core()
    sub, pub = connect(core, A, B)
    sub.sub("t")
    top = wire.SEQ_LIMIT - 1
    packed = [wire.pack_message("t", None, None, b"x")] * 2
    before = core.state_digest()
    out = pub.send(wire.encode_pub(pub.cid, pub.cookie, pub.pid, top, top, reliable, packed), 0.0)
    assert [(f[0], f[1]) for f in frames_to(out, B)] == [(FrameType.ERROR, ErrorCode.MALFORMED)]
    assert core.metrics["error_malformed"] == 1 and core.state_digest() == before
    assert [p for _, _, p in delivered(pub.pub([("t", b"after")]), A)] == [b"after"]
    with pytest.raises(wire.WireError, match="below 2"):  # (and a client refuses such a MSGS)
        decoding.decode_untrusted_frame(wire.encode_msgs(1, top, packed))


# STALE_BATCH is never an ERROR frame, only a command's result in CMDACK (tested below).
@pytest.mark.parametrize(
    "code", [c for c in ErrorCode if c not in (ErrorCode.OK, ErrorCode.STALE_BATCH)], ids=lambda c: c.name
)
def test_every_error_code(code):
    core = make_core(
        max_clients=0 if code is ErrorCode.OVERLOADED else 100,
        max_subscriptions=1 if code is ErrorCode.OVER_CAPACITY else 100,
    )
    data, addr = _trigger(core, code)
    before = core.state_digest()
    out = sends(core.handle_datagrams([(data, addr)], 0.0))
    assert core.metrics[f"error_{code.name.lower()}"] == 1
    assert core.state_digest() == before
    if code is ErrorCode.FORBIDDEN:
        assert out == []  # never answered: the source is not trusted
    elif data[:1].isalpha():
        (reply,) = out
        assert reply.data.startswith(f"ERR {code.name.lower()} ".encode())
    elif code in (ErrorCode.MALFORMED, ErrorCode.UNSUPPORTED_VERSION):  # (2-3 bytes: no ERROR fits in 3x of them)
        assert out == [] and core.metrics["dropped_amplification"] == 1
    else:
        (reply,) = out
        f = decoding.decode_untrusted_frame(reply.data)
        assert f[0] is FrameType.ERROR and f[1] == code


def test_a_restarted_client_with_the_same_id_starts_clean():
    core = make_core()
    old, pub = connect(core, A, B)
    old.cmds([(1, "a", None, 1), (1, "b", None, 1)])
    first_stream = delivered(pub.pub([("a", b"x")]), A)[0][0]
    old.restart()  # a new process, same client id, a greater session, batch counter from 1
    (ack,) = frames_to(old.cmds([(1, "x", None, 1)], now=1.0), A)
    assert ack[0] is FrameType.CMDACK and ack[1:] == (2, 1, [0])
    assert core.clients[old.cid].modes() == {("x", None): Mode.RELIABLE}
    got = delivered(pub.pub([("x", b"y"), ("a", b"z")], now=1.1), A)
    assert [(s, p) for _, s, p in got] == [(1, b"y")] and got[0][0] > first_stream


def test_a_batch_id_with_high_bits_set_is_just_a_later_batch_of_the_same_session():
    core = make_core()
    (fc,) = connect(core, A)
    fc.cmds([(1, "a", None, 1)])
    big = (1 << 20) + 5  # once read as "a new session epoch", which dropped "a"
    (ack,) = frames_to(fc.send(fc.cmds_frame(big, [(1, "b", None, 0)]), 0.1), A)
    assert ack[1:] == (fc.session, big, [ErrorCode.OK])
    assert core.clients[fc.cid].modes() == {("a", None): Mode.RELIABLE, ("b", None): Mode.FIRE}
    (ack,) = frames_to(fc.send(fc.cmds_frame(2**63 - 1, [(1, "c", None, 0)]), 0.2), A)
    assert ack[3] == [ErrorCode.OK] and len(core.clients[fc.cid].modes()) == 3


def test_a_late_batch_of_an_older_session_is_answered_stale_and_changes_nothing():
    core = make_core()
    (fc,) = connect(core, A)
    first = fc.cmds_frame(1, [(1, "a", None, 1)])
    late = fc.cmds_frame(2, [(0, "a", None, 0), (1, "old", None, 1)])  # sent, then delayed in the network
    fc.send(first, 0.0)
    fc.restart()  # the process restarted with the same client id, on another port
    fc.addr = C
    fc.hello(0.5)
    fc.cmds([(1, "a", None, 1)], now=0.5)
    before = core.state_digest()
    for frame, batch in ((late, 2), (first, 1)):  # (batch 1 is also a batch id of the new session)
        (ack,) = frames_to(core.handle_datagrams([(frame, A)], 1.0), A)
        assert ack[0] is FrameType.CMDACK
        assert ack[1:] == (1, batch, [ErrorCode.STALE_BATCH] * (2 if frame is late else 1))
    assert core.state_digest() == before
    assert core.clients[fc.cid].addr == C  # the old address did not take the client back


def test_a_retried_batch_gets_its_own_answer_not_the_latest():
    core = make_core(max_subscriptions_per_client=1)
    (fc,) = connect(core, A)
    fc.cmds([(1, "a", None, 0)])
    (ack,) = frames_to(fc.cmds([(1, "b", None, 0), (1, "c", None, 0)]), A)
    assert ack[1:] == (fc.session, 2, [ErrorCode.OVERLOADED, ErrorCode.OVERLOADED])
    (again,) = frames_to(fc.send(fc.cmds_frame(1, [(1, "a", None, 0)]), 0.1), A)  # the CMDACK was lost
    assert again[1:] == (fc.session, 1, [ErrorCode.OK])


def test_a_batch_older_than_those_remembered_is_answered_stale_and_changes_nothing():
    from roost.node.clients import REMEMBERED_BATCHES

    core = make_core()
    (fc,) = connect(core, A)
    first = fc.cmds_frame(1, [(1, "t", None, 0)])
    fc.send(first, 0.0)
    fc.batch = 1
    for i in range(REMEMBERED_BATCHES):
        fc.cmds([(0, "t", None, 0), (1, f"u{i}", None, 0)])
    assert len(core.clients[fc.cid].answers) == REMEMBERED_BATCHES  # bounded
    before = core.state_digest()
    (ack,) = frames_to(fc.send(first, 1.0), A)
    assert ack[1:] == (fc.session, 1, [ErrorCode.STALE_BATCH])
    assert core.state_digest() == before  # "t" was not subscribed again
    oldest = fc.batch - REMEMBERED_BATCHES + 1
    (ack,) = frames_to(fc.send(fc.cmds_frame(oldest, []), 1.0), A)
    assert ack[1:] == (fc.session, oldest, [ErrorCode.OK, ErrorCode.OK])  # still remembered: its own answer


def test_dropping_the_last_reliable_subscription_forgets_the_stream():
    core = make_core()
    sub, pub = connect(core, A, B)
    sub.sub("t")
    s1 = delivered(pub.pub([("t", b"1"), ("t", b"2")]), A)[0][0]
    sub.cmds([(0, "t", None, 0)])
    sub.sub("t")
    got = delivered(pub.pub([("t", b"3")]), A)
    assert got[0][0] > s1 and got[0][1] == 1


def test_repeated_sack_ranges_cost_no_more_than_one():
    from roost.node.mailbox import Mailbox

    mb = Mailbox(1, 10_000, 0.2, 2.0)
    for i in range(5000):
        mb.push(b"%d" % i)
    mb.take_new(5000, 0.0)
    mb.on_ack(0, [(1, 5000)] * 64, 0.0)
    assert len(mb.sacked) == 5000 and mb.acked == 0


def test_one_host_cannot_take_every_producer_slot():
    core = make_core(max_per_host=3)
    (fc,) = connect(core, FAR)
    codes = []
    for i in range(5):
        msg = wire.pack_message("t", None, None, b"")
        data = wire.encode_pub(fc.cid, fc.cookie, bytes([i]) * 16, 1, 1, False, [msg])
        codes += [f[1] for f in frames_to(fc.send(data, 0.0), FAR) if f[0] is FrameType.ERROR]
    assert codes == [ErrorCode.OVERLOADED, ErrorCode.OVERLOADED] and len(core.producers) == 3
    (other,) = connect(core, B)
    other.pub([("t", b"fine")])
    assert len(core.producers) == 4


def test_text_pub_that_cannot_be_delivered_in_one_datagram_is_refused():
    core = make_core(max_datagram=2000)
    text(core, b"SUB t\n")
    (reply,) = sends(text(core, b"PUB t " + b"x" * 1990, addr=B))
    assert reply.data.startswith(b"ERR too_large")


def test_per_host_count_is_released_when_the_client_goes():
    core = make_core(max_per_host=2, subscriber_timeout=1.0, ping_interval=0.1)
    a, b = connect(core, ("127.0.0.9", 1), ("127.0.0.9", 2))  # one host
    a.sub("t")
    b.sub("t")
    (third,) = connect(core, ("127.0.0.9", 3))
    (err,) = frames_to(third.sub("t"), third.addr)
    assert err[1] == ErrorCode.OVERLOADED
    core.tick(5.0)  # a and b time out
    (ack,) = frames_to(third.sub("t", now=5.1), third.addr)
    assert ack[0] is FrameType.CMDACK


def test_fire_datagrams_are_numbered_so_a_network_duplicate_can_be_told_apart():
    core = make_core()
    pub, sub = connect(core, ("127.0.0.1", 5001), ("127.0.0.1", 5002))
    sub.sub("t", mode=Mode.FIRE)
    firsts = []
    for i in range(3):
        out = pub.pub([("t", b"same")], now=1.0 + i, reliable=False)  # identical messages
        firsts += [f[2] for f in frames_to(out, sub.addr) if f[0] is FrameType.MSGS and f[1] == 0]
    assert len(firsts) == 3 and len(set(firsts)) == 3 and all(firsts)


def test_the_mailbox_window_in_bytes_holds_large_messages_back_until_acknowledged():
    """send_window_bytes: in flight at most that many bytes (one message at least, when none
    is), whatever the window in messages allows; an ACK frees its bytes."""
    from roost.node.mailbox import Mailbox

    mb = Mailbox(1, 100, 0.2, 2.0)
    for i in range(6):
        assert mb.push(bytes([i]) * 4000)
    assert mb.take_new(100, 0.0, 10_000) == (1, [b"\0" * 4000, b"\1" * 4000])
    assert mb.take_new(100, 0.0, 10_000) == (3, [])  # (8,000 in flight: no room for 4,000 more)
    assert mb.on_ack(1, [], 0.1) and mb.inflight == 4000
    assert mb.take_new(100, 0.1, 10_000) == (3, [b"\2" * 4000])
    mb.on_ack(3, [], 0.2)
    assert mb.inflight == 0 and mb.take_new(100, 0.2, 1000) == (4, [b"\3" * 4000])  # larger than the window: alone
    assert mb.take_new(100, 0.2, 1000) == (5, [])


def test_a_reliable_publisher_waits_for_room_in_bytes_as_well_as_in_messages():
    from roost.client.config import ClientConfig
    from roost.client.publisher import Publisher

    pub = Publisher(b"p" * 16, b"f" * 16, ClientConfig(pub_window_bytes=10_000))
    pub.publish("t", None, None, b"x" * 4000, True)
    pub.publish("t", None, None, b"x" * 4000, True)
    assert not pub.window_full
    pub.publish("t", None, None, b"x" * 4000, True)
    assert pub.window_full and len(pub.unacked) == 3
    assert pub.on_puback(b"p" * 16, 2, 0.1) and not pub.window_full and len(pub.unacked) == 1


def test_the_mailbox_window_in_bytes_does_not_hold_back_a_client_that_sacks():
    """A queue group's member SACKs the fragments of a large message it holds until all came:
    counting them as in flight would leave it waiting for the rest for ever (review finding)."""
    from roost.node.mailbox import Mailbox

    mb = Mailbox(1, 100, 0.2, 2.0)
    for i in range(4):
        assert mb.push(bytes([i]) * 4000)
    assert len(mb.take_new(100, 0.0, 8000)[1]) == 2
    assert mb.take_new(100, 0.0, 8000)[1] == []
    mb.on_ack(0, [(1, 2)], 0.1)  # both held, SACKed, not acknowledged
    assert mb.take_new(100, 0.1, 8000) == (3, [b"\2" * 4000, b"\3" * 4000])


def test_client_config_refuses_windows_and_yields_below_one():
    from roost.client.config import ClientConfig
    from roost.client.publisher import Publisher

    for name in ("yield_every", "pub_window_bytes", "pub_window", "idle_burst"):
        with pytest.raises(ValueError, match=f"{name} = 0: must be a positive integer"):
            ClientConfig(**{name: 0})  # type: ignore[arg-type]
    for gap in (-1.0, float("nan"), "0.001", None, True):
        with pytest.raises(ValueError, match=r"idle_gap = .*: must be a number of seconds, 0 or more"):
            ClientConfig(idle_gap=gap)  # type: ignore[arg-type]
    assert ClientConfig(idle_gap=0).idle_gap == 0 and ClientConfig(idle_gap=float("inf")).idle_gap == float("inf")
    with pytest.raises(ValueError, match=r"x.toml: \[client\] idle_gap = nan: must be a positive float"):
        ClientConfig.from_mapping("x.toml", {"idle_gap": float("nan")})
    pub = Publisher(b"p" * 16, b"f" * 16, ClientConfig(pub_window_bytes=1000))
    assert not pub.window_full  # (empty: one message of any size may go)
    pub.publish("t", None, None, b"x" * 5000, True)
    assert pub.window_full


# ------------------------------------------------------------ instruments for the simulator


def test_a_publish_is_traced_with_whom_it_is_owed_only_when_the_config_says_trace():
    """The simulator learns what a member owes from ``publish`` Trace actions (sim/accounting.py);
    a core built without ``trace`` (every shipped one) emits none."""
    from roost.node.actions import Trace

    for trace in (False, True):
        core = make_core(trace=trace)
        sub, fire, pub = connect(core, A, B, ("127.0.0.1", 5003))
        sub.sub("t", mode=Mode.RELIABLE)
        fire.sub("t", mode=Mode.FIRE)
        traces = [a for a in pub.pub([("t", b"1:7"), ("u", b"1:8")]) if a.__class__ is Trace]
        if not trace:
            assert traces == []
            continue
        assert [(t.event, t.fields["topic"], t.fields["payload"], t.fields["owned"]) for t in traces] == [
            ("publish", "t", b"1:7", True),
            ("publish", "u", b"1:8", True),
        ]
        c = core.clients[sub.cid]
        assert traces[0].fields["owes"] == [(sub.cid, sub.addr, c.session, c.subs[("t", None)])]  # (not the fire one)
        assert traces[1].fields["owes"] == []


def test_a_broken_build_is_chosen_by_the_config_the_core_reads():
    """sim/breaks.py's entries of None: the core skips the mechanism itself when its config names it."""
    for breaks in (frozenset(), frozenset({"no-restream"})):
        core = make_core(breaks=breaks)
        (sub,) = connect(core, A)
        sub.sub("t", mode=Mode.RELIABLE)
        stream = core.clients[sub.cid].mailbox.stream_id
        sub.addr = B  # (the same process from another address: a new stream, unless broken)
        sub.hello()
        sub.ping(1.0)
        moved = core.clients[sub.cid]
        assert moved.addr == B and (moved.mailbox.stream_id == stream) == bool(breaks)


def test_a_node_built_to_accept_any_cookie_takes_a_wrong_one():
    """tests/test_fuzz.py's broken node ("accept-any-cookie"): the campaign must catch it."""
    for breaks in (frozenset(), frozenset({"accept-any-cookie"})):
        core = make_core(breaks=breaks)
        sub, pub = connect(core, A, B)
        sub.sub("t", mode=Mode.FIRE)
        pub.cookie = bytes(len(pub.cookie))
        out = pub.pub([("t", b"x")], reliable=False)
        assert bool(delivered(out, A)) == bool(breaks)
