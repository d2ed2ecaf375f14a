"""Messages larger than one datagram (client/parts.py): split, carried, put together."""

from __future__ import annotations

import random

import msgpack
import pytest
import trio

from roost.client import Client, decoding, parts, wire
from roost.client.config import ClientConfig
from roost.client.publisher import Publisher
from roost.client.wire import FrameType, Mode, WireError
from tests.clusterkit import node_process  # noqa: F401  (the fixture ``node``: a node process)
from tests.corekit import connect, frames_to, make_core
from tests.test_session import connected_session, wrap

A = ("127.0.0.1", 5001)
B = ("127.0.0.1", 5002)
C = ("127.0.0.1", 5003)
P = ("127.0.0.1", 5004)
PID = b"p" * 16


def _payload(n: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(n)


def _fragments(payload: bytes, tags=None, first: int = 1, md: int = 16384) -> list[bytes]:
    """Fragment messages as a node delivers them: with producer id and sequence."""
    packed = parts.split("big.x", None, tags, payload, parts.part_id(PID, first), md)
    return [wire.pack([*msgpack.unpackb(p), PID, first + i]) for i, p in enumerate(packed)]


# ---------------------------------------------------------------- splitting


def test_split_fills_datagrams_and_each_part_fits_with_room_for_delivery():
    payload = _payload(900_000)
    packed = parts.split("big.x", "k", {"kind": "blob"}, payload, "ab-1", 16384)
    assert all(len(p) <= 16384 - wire.MESSAGE_ROOM for p in packed)
    ms = [wire.check_message(msgpack.unpackb(p)) for p in packed]
    room = len(ms[0][3])
    assert room > 16384 - wire.MESSAGE_ROOM - 80 and len(packed) == -(-900_000 // room) == 57
    assert b"".join(m[3] for m in ms) == payload
    assert [m[2][wire.PART_TAG] for m in ms[:2]] == ["ab-1 0 57 900000", "ab-1 1 57 900000"]
    assert all(m[2]["kind"] == "blob" and m[1] == "k" for m in ms)


def test_split_refuses_what_leaves_too_little_room_and_a_full_tag_set():
    with pytest.raises(WireError, match="at most 31 tags"):
        parts.split("t", None, {f"k{i}": "v" for i in range(32)}, b"x" * 20_000, "a-1", 16384)
    with pytest.raises(WireError, match="needs at least half of each"):
        parts.split("t", None, {f"k{i}": "v" * 250 for i in range(31)}, b"x" * 20_000, "a-1", 16384)


@pytest.mark.parametrize("value", [None, 5, "", "a 0 1", "a 0 1 2 3", "a x 1 2", "a 1 1 5", "a -1 2 5",
                                   " 0 1 5", "a 0 3 2", "a 0 2000000 9000000",
                                   "a 0 3 1000"])  # fmt: skip
def test_a_malformed_part_tag_does_not_parse(value):
    assert parts.parse_part_untrusted(value) is None


# ---------------------------------------------------------------- putting together


def test_the_reassembler_takes_parts_in_any_order_once_and_within_its_bounds():
    cost = parts.FRAGMENT_COST  # (charged per fragment held: empty ones count too)
    r = parts.Reassembler(max_payload=100, max_bytes=2 * (60 + cost) + 10, timeout=5.0)
    chunks = [b"a" * 40, b"b" * 40, b"c" * 20]
    order = [2, 0, 2, 1]  # (one repeat)
    done = None
    for i in order:
        done, dropped = r.add(b"p1", ("m", i, 3, 100), chunks[i], None, 0.0)
        assert dropped == []
    assert done is not None and done.payload == b"".join(chunks) and r.held == 0 and not r.partials
    # over max_payload: refused on sight
    assert r.add(b"p1", ("n", 0, 2, 101), b"x", None, 0.0) == (None, [])
    assert r.dropped == 1 and not r.partials
    # over max_bytes together: the oldest partial message goes
    r.add(b"p1", ("o1", 0, 2, 100), b"x" * 60, "o1", 1.0)
    r.add(b"p2", ("o2", 0, 2, 100), b"y" * 60, "o2", 2.0)
    done, dropped = r.add(b"p3", ("o3", 0, 2, 100), b"z" * 60, "o3", 3.0)
    assert done is None and [p.origins for p in dropped] == [["o1"]] and r.held == 2 * (60 + cost)
    # a part that contradicts its message's others drops that message
    done, dropped = r.add(b"p2", ("o2", 1, 3, 100), b"y", "o2b", 3.0)
    assert [p.origins for p in dropped] == [["o2"], ["o2b"]] and r.dropped == 3  # (the refused one's too)
    # timed out
    assert [p.origins for p in r.expire(7.9)] == []
    assert [p.origins for p in r.expire(8.0)] == [["o3"]] and r.held == 0 and r.dropped == 4


# ---------------------------------------------------------------- the publisher


def _publisher(md: int = 16384) -> Publisher:
    pub = Publisher(PID, b"f" * 16, ClientConfig())
    pub.max_datagram = md
    return pub


def test_the_publisher_sends_a_large_reliable_message_in_parts_and_refuses_the_rest_by_name():
    pub = _publisher()
    assert pub.publish("t", None, None, b"small", True) == 1
    last = pub.publish("t", None, {"a": "b"}, _payload(100_000), True)
    assert last == 1 + 7 and len(pub.unacked) == 8 and pub.next_seq == 9
    with pytest.raises(WireError, match=r"fire publishes are one datagram each.*max_payload \(1,048,576 bytes\)"):
        pub.publish("t", None, None, _payload(20_000), False)
    with pytest.raises(WireError, match=r"payload of 1,048,577 bytes is over max_payload \(1,048,576"):
        pub.publish("t", None, None, bytes(1_048_577), True)
    with pytest.raises(WireError, match=r"roost\.part is reserved"):
        pub.publish("t", None, {wire.PART_TAG: "x 0 1 1"}, b"x", True)
    assert pub.next_seq == 9 and not pub.fire_unsent  # (nothing refused was queued)


def test_a_session_takes_the_node_s_max_payload_and_send_window_from_welcome():
    s = connected_session()
    s.handle_datagrams(wrap([wire.encode_welcome("n1", b"k" * 16, {"max_payload": 50_000, "send_window": 8}, [])]),
                       0.1)  # fmt: skip
    with pytest.raises(WireError, match=r"over max_payload \(50,000"):
        s.publish("t", None, None, bytes(50_001), True)
    assert s.publish("t", None, None, bytes(30_000), True) == 2  # (2 parts: a quarter of 8)
    with pytest.raises(WireError, match=r"would take 3 parts at max_datagram 16,384: at most 2 \(a quarter"):
        s.publish("t", None, None, bytes(40_000), True)


# ---------------------------------------------------------------- the receive side


def test_a_session_puts_a_large_message_together_across_two_nodes_streams_once():
    s = connected_session()
    st = s.subscribe("big.>", None, Mode.RELIABLE)
    payload = _payload(60_000)
    frags = _fragments(payload, {"kind": "blob"})
    assert len(frags) == 4
    other = ("127.0.0.1", 7401)
    s.add_candidates([other])  # (a member of the cluster: a failover moved the rest there)
    s.handle_datagrams(wrap([wire.encode_msgs(7, 1, frags[:2])]), 0.1)
    s.handle_datagrams([(wire.encode_msgs(9, 1, frags[1:]), other)], 0.2)  # (frags[1] again: a duplicate)
    s.handle_datagrams(wrap([wire.encode_msgs(7, 3, frags[2:3])]), 0.3)  # (and one more, late)
    (m,) = st.messages()
    assert (m.topic, m.tags, m.payload, m.sequence) == ("big.x", {"kind": "blob"}, payload, 3)
    assert s.recv.parts.partials == {} and s.recv.parts.held == 0


def test_a_group_s_large_message_is_acknowledged_once_taken_and_a_stale_one_is_given_up():
    cfg = ClientConfig(reassembly_timeout=0.5)
    s = connected_session(cfg=cfg)
    g = "big.* queue=w"
    st = s.subscribe(g, None, Mode.RELIABLE)
    mark = [wire.mark_id(g, None)]
    frags = [wire.mark_delivery(f, mark) for f in _fragments(_payload(40_000))]
    s.handle_datagrams(wrap([wire.encode_msgs(7, 1, frags)]), 0.1)
    (a,) = [f for f in map(decoding.decode_untrusted_frame, [d for _, d in s.outgoing(0.1)]) if f[0] is FrameType.ACK]
    assert (a[4], a[5]) == (0, [(1, 3)]) and len(st.queue) == 1  # (held, not acknowledged)
    s.consumed(st)
    st.take()
    (a,) = [f for f in map(decoding.decode_untrusted_frame, [d for _, d in s.outgoing(0.2)]) if f[0] is FrameType.ACK]
    assert (a[4], a[5]) == (3, [])
    # a message whose last part never comes: acknowledged once given up, so the stream moves on
    frags = [wire.mark_delivery(f, mark) for f in _fragments(_payload(40_000, 2), first=4)]
    s.handle_datagrams(wrap([wire.encode_msgs(7, 4, frags[:2])]), 1.0)
    (a,) = [f for f in map(decoding.decode_untrusted_frame, [d for _, d in s.outgoing(1.0)]) if f[0] is FrameType.ACK]
    assert a[4] == 3
    s.tick(1.6)
    (a,) = [f for f in map(decoding.decode_untrusted_frame, [d for _, d in s.outgoing(1.6)]) if f[0] is FrameType.ACK]
    assert a[4] == 5 and s.recv.parts.dropped == 1 and not st.queue


def test_a_fragment_published_fire_or_with_a_made_up_tag_is_dropped_and_counted():
    s = connected_session()
    st = s.subscribe("big.x", None, Mode.RELIABLE)
    bogus = [wire.pack_message("big.x", None, {wire.PART_TAG: "a 0 2 10"}, b"x"),
             wire.pack_delivery("big.x", None, {wire.PART_TAG: "nonsense"}, b"x", PID, 1)]  # fmt: skip
    s.handle_datagrams(wrap([wire.encode_msgs(0, 1, bogus[:1]), wire.encode_msgs(7, 1, bogus[1:])]), 0.1)
    assert not st.queue and s.recv.parts.dropped == 2


# ---------------------------------------------------------------- the node: queue groups


def test_a_queue_group_gets_every_part_of_a_message_at_one_member_also_when_it_is_handed_on():
    core = make_core()
    a, b, c, pub = connect(core, A, B, C, P)
    for member in (a, b, c):
        member.sub("big.* queue=w")
    frags = parts.split("big.x", None, None, _payload(100_000), parts.part_id(pub.pid, 1), 16384)
    out = [x for i, f in enumerate(frags) for x in pub.send(wire.encode_pub(
        pub.cid, pub.cookie, pub.pid, i + 1, 1, True, [f]), 0.0)]  # fmt: skip
    got = {m.addr: [x for f in frames_to(out, m.addr) if f[0] is FrameType.MSGS for x in f[3]] for m in (a, b, c)}
    (holder,) = [addr for addr, msgs in got.items() if msgs]
    assert len(got[holder]) == len(frags) == 7
    # the holder leaves before acknowledging: every part goes on to one other member, the same one
    (h,) = [m for m in (a, b, c) if m.addr == holder]
    out = h.cmds([(2, "big.* queue=w", None, 0)], 0.1)
    got = {m.addr: [x for f in frames_to(out, m.addr) if f[0] is FrameType.MSGS for x in f[3]] for m in (a, b, c)}
    (heir,) = [addr for addr, msgs in got.items() if msgs]
    assert heir != holder and [m[3] for m in got[heir]] == [wire.check_message(
        msgpack.unpackb(p))[3] for p in frags]  # fmt: skip
    assert core.metrics["queue_redelivered"] == 7


# ---------------------------------------------------------------- a real node


async def test_a_900_kb_reliable_message_through_a_real_node(node):
    payload = _payload(900_000, 3)
    async with Client(node.addr) as c:
        async with c.subscribe("big.x") as sub, c.subscribe("big.*", queue="w") as grp:
            seq = await c.publish("big.x", payload, tags={"kind": "blob"}, wait=True, timeout=10)
            assert (seq, await c.publish("big.x", "after")) == (1, 2)  # (one publish to the caller)
            with trio.fail_after(10):
                m = await sub.next()
                assert (m.payload, m.tags) == (payload, {"kind": "blob"})
                assert (await sub.next()).payload == b"after"
                assert (await grp.next()).payload == payload
        with pytest.raises(WireError, match="fire publishes are one datagram each"):
            await c.publish("big.x", payload, mode="fire")


# ---------------------------------------------------------------- review findings (second review)


G = "big.* queue=w"


def _group_session():
    s = connected_session(cfg=ClientConfig(reassembly_timeout=0.5))
    return s, s.subscribe(G, None, Mode.RELIABLE)


def _acked(s, now) -> list[tuple[int, int, list]]:
    return [(f[3], f[4], f[5]) for f in map(decoding.decode_untrusted_frame, [d for _, d in s.outgoing(now)])
            if f[0] is FrameType.ACK]  # fmt: skip


def _marked(frags):
    return [wire.mark_delivery(f, [wire.mark_id(G, None)]) for f in frags]


def test_a_group_fragment_the_reassembler_refuses_is_acknowledged_at_once():
    s, st = _group_session()
    bogus = wire.mark_delivery(wire.pack_delivery("big.x", None, {wire.PART_TAG: "x 0 2 2000000"}, b"x", PID, 1),
                               [wire.mark_id(G, None)])  # fmt: skip
    s.handle_datagrams(wrap([wire.encode_msgs(7, 1, [bogus])]), 0.1)
    assert _acked(s, 0.1) == [(7, 1, [])] and not st.queue and s.recv.parts.dropped == 1


def test_a_whole_large_message_carried_over_to_a_new_stream_is_not_queued_twice():
    s, st = _group_session()
    frags = _marked(_fragments(_payload(40_000)))
    s.handle_datagrams(wrap([wire.encode_msgs(7, 1, frags)]), 0.1)
    assert len(st.queue) == 1
    s.handle_datagrams(wrap([wire.encode_msgs(8, 1, frags)]), 0.2)  # (we moved: the node starts over)
    assert len(st.queue) == 1 and not s.recv.parts.partials
    assert _acked(s, 0.2) == [(8, 0, [(1, 3)])]
    s.consumed(st)
    st.take()
    assert _acked(s, 0.3) == [(8, 3, [])] and st.holding == {}


def test_leaving_a_group_in_the_middle_of_a_large_message_acknowledges_its_parts_once_unsubscribed():
    s, _ = _group_session()
    s.outgoing(0.0)
    s.handle_datagrams(wrap([wire.encode_cmdack(s.session, 1, [0])]), 0.05)
    frags = _marked(_fragments(_payload(40_000)))
    s.handle_datagrams(wrap([wire.encode_msgs(7, 1, frags[:2])]), 0.1)
    assert _acked(s, 0.1) == [(7, 0, [(1, 2)])]
    s.unsubscribe(G, None)
    s.outgoing(0.15)
    s.handle_datagrams(wrap([wire.encode_cmdack(s.session, 2, [0])]), 0.2)
    assert _acked(s, 0.2) == [(7, 2, [])]  # (not after reassembly_timeout: the node handed them on)
