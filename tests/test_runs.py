"""Runs: fire messages of one topic, no key, no tags, sent as PUBRUN (the topic once, then the
payloads) and relayed as MSGSRUN (docs/protocol.md, "Runs"). The publisher, the node core and
the receiver driven directly; the end-to-end path through sockets is every fire test's."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from roost.client import decoding, wire
from roost.client.config import ClientConfig
from roost.client.publisher import Publisher
from roost.client.receive import Receiver, SubState
from roost.client.wire import ErrorCode, FrameType, Mode, WireError
from roost.node.core import BrokerCore
from tests.corekit import PAD, FakeClient, connect, frames_to, make_core, sends

NODE_ADDR = ("127.0.0.1", 7400)
A = ("127.0.0.1", 5001)
B = ("127.0.0.1", 5002)
C = ("127.0.0.1", 5003)
D = ("127.0.0.1", 5004)
E_ = ("127.0.0.1", 5005)
SRC = ("127.0.0.1", 9)


def _publisher() -> Publisher:
    """A publisher whose node's WELCOME said ``runs``."""
    pub = Publisher(b"p" * 16, b"f" * 16, ClientConfig())
    pub.runs = True
    return pub


def _sent(pub: Publisher) -> list[tuple[Any, ...]]:
    out: list[tuple[tuple[str, int], bytes]] = []
    pub.emit(NODE_ADDR, b"c" * 16, b"k" * 16, 0.0, out)
    return [decoding.decode_untrusted_frame(d) for _, d in out]


def _fire_messages(frames: list[tuple[Any, ...]]) -> list[tuple[int, str, bytes]]:
    """(producer sequence, topic, payload) of every fire message sent, PUB or PUBRUN, in order."""
    got = []
    for f in frames:
        if f[0] is FrameType.PUBRUN:
            got += [(f[4] + i, f[5], p) for i, p in enumerate(f[6])]
        elif f[0] is FrameType.PUB and not f[6]:
            got += [(f[4] + i, m[0], m[3]) for i, m in enumerate(f[7])]
    return got


def test_a_publishers_fire_messages_of_one_topic_go_as_runs_and_anything_else_keeps_their_order() -> None:
    pub = _publisher()
    for i in range(3):
        pub.publish("a", None, None, b"a%d" % i, False)
    assert pub.fire_unsent == 3 and not pub.fire_pending  # (a run)
    frames = _sent(pub)
    assert [f[0] for f in frames] == [FrameType.PUBRUN] and frames[0][4:] == (1, "a", [b"a0", b"a1", b"a2"])
    # another topic, a keyed message, a long payload: each turns what is queued into packed messages
    sequence = [("a", None, b"a3"), ("b", None, b"b0"), ("b", None, b"b1"), ("a", "k", b"ak"),
                ("a", None, b"x" * 256), ("a", None, b"a4")]  # fmt: skip
    for topic, key, payload in sequence:
        pub.publish(topic, key, None, payload, False)
    assert pub.fire_unsent == len(sequence) and pub.run == [b"a3"]  # (the rest waits behind it, packed)
    frames = _sent(pub)
    assert [f[0] for f in frames] == [FrameType.PUB]  # (a run no longer than what follows it: packed in front)
    assert _fire_messages(frames) == [(4 + i, t, p) for i, (t, _, p) in enumerate(sequence)]
    assert pub.publish("b", None, None, b"b2", False) == 0 and pub.run == [b"b2"]  # (a new turn: a new run)
    assert pub.publish("a", None, None, b"r", True) == 1 and pub.run == [b"b2"]  # (reliable: apart)
    assert _fire_messages(_sent(pub)) == [(10, "b", b"b2")]
    for key, payload in [(None, b"c0"), ("k", b"ck"), (None, b"c1"), (None, b"y" * 300)]:  # (after a run)
        pub.publish("c", key, None, payload, False)
    assert _fire_messages(_sent(pub)) == [(11, "c", b"c0"), (12, "c", b"ck"), (13, "c", b"c1"), (14, "c", b"y" * 300)]
    for i in range(5):  # (a run longer than what follows it goes as a run, first)
        pub.publish("d", None, None, b"d%d" % i, False)
    pub.publish("e", None, None, b"e0", False)
    frames = _sent(pub)
    assert [f[0] for f in frames] == [FrameType.PUBRUN, FrameType.PUB]
    assert _fire_messages(frames) == [(15 + i, "d", b"d%d" % i) for i in range(5)] + [(20, "e", b"e0")]


def test_a_run_longer_than_a_datagram_goes_as_several_with_consecutive_sequences() -> None:
    pub = _publisher()
    pub.max_datagram = 1200
    payloads = [b"%03d" % i + b"x" * 97 for i in range(40)]
    for p in payloads:
        pub.publish("t", None, None, p, False)
    out: list[tuple[tuple[str, int], bytes]] = []
    pub.emit(NODE_ADDR, b"c" * 16, b"k" * 16, 0.0, out)
    assert len(out) == 4 and all(len(d) <= 1200 for _, d in out)
    frames = [decoding.decode_untrusted_frame(d) for _, d in out]
    assert _fire_messages(frames) == [(1 + i, "t", p) for i, p in enumerate(payloads)]
    assert pub.fire_seq == 41


def test_a_bad_topic_is_refused_and_a_tiny_datagram_sends_no_runs() -> None:
    pub = _publisher()
    for bad in ("", "a b", "a.*", 5):
        with pytest.raises(WireError):
            pub.publish(bad, None, None, b"x", False)  # type: ignore[arg-type]
    assert pub.fire_unsent == 0
    pub.max_datagram = 300  # (no room for a run's payload of 255: refused as a packed message is)
    with pytest.raises(WireError, match="fire publishes are one datagram each"):
        pub.publish("t" * 100, None, None, b"x", False)
    assert pub.fire_unsent == 0
    pub = _publisher()
    pub.publish("t" * 100, None, None, b"x", False)
    assert pub.run == [b"x"]
    pub.max_datagram = 300  # (lowered after the run began, as a WELCOME may: packed when sent)
    assert [f[0] for f in _sent(pub)] == [FrameType.PUB]


def _node(*, wildcard: bool = False, reliable: bool = False, text_sub: bool = False) -> tuple[BrokerCore, FakeClient]:
    """A core with a fire subscriber of "t" at A, a publisher at C, and the ``others`` asked for."""
    core = make_core()
    fire, pub, other, rel = connect(core, A, C, E_, B)
    fire.sub("t", mode=Mode.FIRE)
    if wildcard:
        other.sub("x.>")
    if reliable:
        rel.sub("t")
    if text_sub:
        core.handle_datagrams([(b"SUB t\n" + PAD, D)], 0.0)
    return core, pub


def _pubrun(pub: FakeClient, first: int, payloads: list[bytes]) -> bytes:
    return wire.encode_pubrun(pub.cid, pub.cookie, pub.pid, first, "t", payloads)


def _got(out: list[Any], addr: tuple[str, int]) -> list[tuple[FrameType, list[bytes]]]:
    got = []
    for f in frames_to(out, addr):
        if f[0] is FrameType.MSGSRUN:
            got.append((FrameType.MSGSRUN, f[3]))
        elif f[0] is FrameType.MSGS:
            got.append((FrameType.MSGS, [m[3] for m in f[3]]))
    return got


@pytest.mark.parametrize("others", [{}, {"wildcard": True}, {"reliable": True}, {"text_sub": True}])
def test_the_node_relays_a_run_as_one_msgsrun_or_else_as_a_pubs_messages(others: dict[str, bool]) -> None:
    core, pub = _node(**others)
    payloads = [b"%d" % i for i in range(20)]
    out = pub.send(_pubrun(pub, 1, payloads), 0.0)
    relayed = not others
    assert _got(out, A) == [(FrameType.MSGSRUN if relayed else FrameType.MSGS, payloads)]
    if others.get("reliable"):
        assert [m[3] for f in frames_to(out, B) if f[0] is FrameType.MSGS for m in f[3]] == payloads
    if others.get("text_sub"):
        assert [s.data for s in sends(out) if s.addr == D] == [b"MSG t\n%d" % i for i in range(20)]
    assert core.metrics["published"] == 20 and core.index.matched["t"] == 20
    # a resent run is dropped (fire producer sequences), an overlapping one delivers its new part
    assert _got(pub.send(_pubrun(pub, 1, payloads), 1.0), A) == []
    assert core.metrics["pub_duplicates"] == 20
    more = [b"%d" % i for i in range(15, 25)]
    assert _got(pub.send(_pubrun(pub, 16, more), 2.0), A) == [
        (FrameType.MSGSRUN if relayed else FrameType.MSGS, more[5:])
    ]


def test_a_run_after_single_messages_in_one_batch_keeps_their_order() -> None:
    core, pub = _node()
    single = wire.encode_pub(pub.cid, pub.cookie, pub.pid, 1, 1, False, [wire.pack_message("t", None, None, b"0")])
    for batch, expected in [
        ([single, _pubrun(pub, 2, [b"1", b"2"])], [(FrameType.MSGS, [b"0", b"1", b"2"])]),
        ([_pubrun(pub, 4, [b"3", b"4"]), _pubrun(pub, 6, [b"5"])], [(FrameType.MSGSRUN, [b"3", b"4", b"5"])]),
    ]:  # fmt: skip (two runs, one datagram)
        out = core.handle_datagrams([(d, C) for d in batch], 1.0)
        assert _got(out, A) == expected


def test_a_relayed_run_of_the_largest_pubrun_fits_in_max_datagram() -> None:
    core = make_core(max_datagram=1200)
    fire, pub = connect(core, A, C)
    fire.sub("t", mode=Mode.FIRE)
    room = wire.pubrun_room(1200, "t")
    payloads = [b"x" * 255] * (room // 257)
    data = _pubrun(pub, 1, payloads)
    assert len(data) <= 1200
    (relayed,) = [s.data for s in sends(pub.send(data, 0.0)) if s.addr == A]
    assert len(relayed) <= 1200 and decoding.decode_untrusted_frame(relayed)[3] == payloads


def _receiver(max_buffered: int = 100) -> tuple[Receiver, SubState]:
    st = SubState("t", Mode.FIRE)
    return Receiver({("t", None): st}, [], ClientConfig(max_buffered=max_buffered)), st


def test_the_receiver_queues_a_run_whole_drops_a_duplicated_datagram_and_counts_its_buffer() -> None:
    r, st = _receiver(max_buffered=5)
    r.on_run(SRC, 7, "t", [b"a", b"b"])
    r.on_run(SRC, 7, "t", [b"a", b"b"])  # (the network duplicated it)
    r.on_run(SRC, 8, "other", [b"o"])  # (no subscription)
    assert [m.payload for m in st.messages()] == [b"a", b"b"] and r.buffered == 2 and r.duplicates == 2
    assert {m.sequence for m in st.messages()} == {None}
    r.on_run(SRC, 9, "t", [b"c", b"d", b"e", b"f"])  # (room for 3 more: the rest dropped, counted)
    assert [m.payload for m in st.messages()] == [b"a", b"b", b"c", b"d", b"e"] and r.buffered == 5
    assert ("fire_dropped", 1) in r.events


def test_the_receiver_gives_a_run_to_wildcard_subscriptions_too() -> None:
    r, st = _receiver()
    wide = SubState("t.>", Mode.FIRE)
    r.subs[("t.>", None)] = wide
    r.track("t.>", 1)
    r.on_run(SRC, 1, "t.x", [b"1", b"2"])
    r.on_run(SRC, 2, "t", [b"3"])
    assert [m.payload for m in wide.messages()] == [b"1", b"2"] and [m.payload for m in st.messages()] == [b"3"]


def test_small_batches_relayed_whole_share_datagrams_in_order_up_to_max_datagram() -> None:
    """Many publishers' small fire batches in one node batch: a subscriber gets them in few
    datagrams (node/relay.py), consecutive ones of one kind merged, each under max_datagram,
    every message once and in the order the batches came."""
    core = make_core(max_datagram=1200)
    fire, *pubs = connect(core, A, *[("127.0.0.1", 5100 + i) for i in range(30)])
    fire.sub("t", mode=Mode.FIRE)
    batch, expected = [], []
    for i, p in enumerate(pubs):
        payloads = [b"%02d-%02d" % (i, k) + b"x" * 40 for k in range(3 if i % 10 else 20)]
        expected += payloads
        if i // 10 == 1:  # (the middle ten: PUBs, relayed as their arrays; the others PUBRUNs)
            packed = [wire.pack_message("t", None, None, x) for x in payloads]
            batch.append((wire.encode_pub(p.cid, p.cookie, p.pid, 1, 1, False, packed), p.addr))
        else:
            batch.append((wire.encode_pubrun(p.cid, p.cookie, p.pid, 1, "t", payloads), p.addr))
    out = core.handle_datagrams(batch, 1.0)
    data = [s.data for s in sends(out) if s.addr == A]
    frames = [decoding.decode_untrusted_frame(d) for d in data]
    got = [p for f in frames for p in (f[3] if f[0] is FrameType.MSGSRUN else [m[3] for m in f[3]])]
    assert got == expected and core.metrics["delivered"] == len(expected)
    assert [k for k, _ in itertools.groupby(f[0] for f in frames)] == [
        FrameType.MSGSRUN,
        FrameType.MSGS,
        FrameType.MSGSRUN,
    ]
    assert all(len(d) <= 1200 for d in data) and len(data) < len(batch) / 3
    assert len({f[2] if f[0] is FrameType.MSGS else f[1] for f in frames}) == len(frames)  # (each numbered)


def test_a_client_sends_runs_only_to_a_node_whose_welcome_says_it_takes_them() -> None:
    from tests.test_session import connected_session

    s = connected_session()  # (its WELCOME, made by hand, says nothing of runs: an earlier build's)
    assert not s.pub.runs
    for i in range(3):
        s.pub.publish("t", None, None, b"%d" % i, False)
    assert [f[0] for f in _sent(s.pub)] == [FrameType.PUB]
    (welcome,) = frames_to(make_core().handle_datagrams([(wire.encode_hello(b"c" * 16), SRC)], 0.0), SRC)
    s._on_welcome(*welcome[1:5])  # (this build's node)
    assert s.pub.runs
    for i in range(3):
        s.pub.publish("t", None, None, b"%d" % i, False)
    assert [f[0] for f in _sent(s.pub)] == [FrameType.PUBRUN]
    s.pub.publish("t", None, None, b"queued", False)
    s._on_welcome("n2", b"k" * 16, {"max_datagram": 16384}, [])  # (failed over to an earlier build)
    (f,) = _sent(s.pub)
    assert f[0] is FrameType.PUB and [m[3] for m in f[7]] == [b"queued"]  # (the run queued goes as a PUB)
    s._on_welcome(*welcome[1:5])
    for i in range(5):  # (a run, then packed messages behind it: a move to a node that takes runs)
        s.pub.publish("t", None, None, b"r%d" % i, False)
    s.pub.publish("t", "k", None, b"keyed", False)
    s._on_welcome(*welcome[1:5])
    assert [(f[0], f[4]) for f in _sent(s.pub)] == [
        (FrameType.PUBRUN, 8),
        (FrameType.PUB, 13),
    ]  # (in order, numbered on)
    s.handle_datagrams([(wire.encode_error(ErrorCode.UNKNOWN_TYPE, "no cluster map: not a member"), s.node)], 1.0)
    assert s.pub.runs  # (a refusal of something else: a MAP to a node with no map)
    s.pub.publish("t", None, None, b"sent", False)
    s.handle_datagrams([(wire.encode_error(ErrorCode.UNKNOWN_TYPE, decoding.UNKNOWN_FRAME), s.node)], 1.0)
    assert not s.pub.runs  # (its node's decoder refused a PUBRUN: rolled back with the cookie still good)
    (f,) = _sent(s.pub)
    assert f[0] is FrameType.PUB and [m[3] for m in f[7]] == [b"sent"]  # (what was queued goes as a PUB)


def _array(items: list[bytes], form: int) -> bytes:
    """A msgpack array of ``items`` (each packed) with its header in ``form``: 0 the shortest,
    16 an array 16, 32 an array 32 (valid, longer than needed)."""
    n = len(items)
    head = wire.array_header(n) if form == 0 else (b"\xdc" + n.to_bytes(2, "big") if form == 16 else
                                                  b"\xdd" + n.to_bytes(4, "big"))  # fmt: skip
    return head + b"".join(items)


@pytest.mark.parametrize("seed", range(20))
def test_merged_datagrams_decode_keep_order_and_fit(seed: int) -> None:
    """node/relay.py on batches of both heads, their arrays' headers in any valid form: every
    datagram decodes, is at most max_datagram, and together they hold every message once, in
    order, each datagram numbered."""
    import random

    from roost.node import relay

    rng = random.Random(seed)
    max_datagram = rng.choice([1200, 4000, 16384])
    budget = max_datagram - wire.MSGS_HEADER_MAX
    whole: list[relay.Whole] = []
    expected: list[tuple[str, bytes]] = []
    for b in range(rng.randint(1, 30)):
        payloads = [b"%d-%d" % (b, i) * rng.randint(0, 8) for i in range(rng.randint(1, 12))]
        topic = rng.choice(["t", "u"])
        if rng.random() < 0.5:
            body = _array([wire.pack_message(topic, None, None, p) for p in payloads], rng.choice([0, 16, 32]))
            whole.append((body, len(payloads), b""))
        else:
            head = wire.pack(topic)
            body = head + _array([wire.pack(p) for p in payloads], rng.choice([0, 16, 32]))
            whole.append((body, len(payloads), head))
        expected += [(topic, p) for p in payloads]
    numbers = iter(range(2**64 - 100, 2**64))
    data = relay.datagrams(whole, budget, lambda: next(numbers))
    frames = [decoding.decode_untrusted_frame(d) for d in data]
    assert all(len(d) <= max_datagram for d in data)
    got: list[tuple[str, bytes]] = []
    for f in frames:
        got += [(f[2], p) for p in f[3]] if f[0] is FrameType.MSGSRUN else [(m[0], m[3]) for m in f[3]]
    assert got == expected  # (each message once, in order, under its own topic)
    assert [f[1] if f[0] is FrameType.MSGSRUN else f[2] for f in frames] == list(
        range(2**64 - 100, 2**64 - 100 + len(data))
    )


def test_batches_that_fit_share_one_datagram_and_one_that_does_not_starts_the_next() -> None:
    from roost.node import relay

    head = wire.pack("t")
    small = (head + wire.pack([b"x" * 10] * 3), 3, head)
    assert len(relay.datagrams([small] * 30, 2000, lambda: 1)) == 1  # (30 runs of one topic: one MSGSRUN)
    other = wire.pack("u")
    mixed = [small, (other + wire.pack([b"y"]), 1, other), small]
    assert [decoding.decode_untrusted_frame(d)[2] for d in relay.datagrams(mixed, 2000, lambda: 1)] == ["t", "u", "t"]
    big = (head + wire.pack([b"z" * 200] * 9), 9, head)  # (1,831 bytes: two do not fit 2,000)
    assert [len(decoding.decode_untrusted_frame(d)[3]) for d in relay.datagrams([big, small, big], 2000, lambda: 1)] \
        == [12, 9]  # fmt: skip
