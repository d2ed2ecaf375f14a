"""The binary codec: every frame type round-trips; bad input is a WireError."""

from __future__ import annotations

import inspect

import msgpack
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from roost.client import clustermap, decoding, durablewire, wire
from roost.client.text import encode_text_msg, parse_untrusted_text
from roost.client.wire import ErrorCode, FrameType, WireError

CID, COOKIE, PID = b"c" * 16, b"k" * 16, b"p" * 16
M = wire.pack_message("t", "k", {"a": "b"}, b"\x00payload")
CMAP = clustermap.compute(
    4,
    {"n1": (("127.0.0.1", 7401), ("127.0.0.1", 7501)), "n2": (("127.0.0.1", 7402), ("127.0.0.1", 7502))},
    {"n1", "n2"},
    16,
    2,
)

EVERY_FRAME = {
    FrameType.HELLO: (wire.encode_hello(CID), (FrameType.HELLO, CID)),
    FrameType.WELCOME: (
        wire.encode_welcome("n1", COOKIE, {"max_datagram": 1500}, [["n1", "127.0.0.1", 7400]]),
        (FrameType.WELCOME, "n1", COOKIE, {"max_datagram": 1500}, [("n1", "127.0.0.1", 7400)], None),
    ),
    FrameType.CMDS: (
        wire.encode_cmds(CID, COOKIE, 2**63 - 1, 7, [(1, "t", None, 1), (0, "t", "k", 0)]),
        (FrameType.CMDS, CID, COOKIE, 2**63 - 1, 7, [(1, "t", None, 1), (0, "t", "k", 0)]),
    ),
    FrameType.CMDACK: (wire.encode_cmdack(3, 7, [0, 10, 14]), (FrameType.CMDACK, 3, 7, [0, 10, 14])),
    FrameType.PUB: (
        wire.encode_pub(CID, COOKIE, PID, 5, 3, True, [M]),
        (FrameType.PUB, CID, COOKIE, PID, 5, 3, True, [("t", "k", {"a": "b"}, b"\x00payload")]),
    ),
    FrameType.PUBACK: (wire.encode_puback(PID, 5), (FrameType.PUBACK, PID, 5)),
    FrameType.MSGS: (wire.encode_msgs(9, 1, [M, wire.pack_delivery("t", None, None, b"r", PID, 4)]),
             (FrameType.MSGS, 9, 1, [("t", "k", {"a": "b"}, b"\x00payload"), ("t", None, None, b"r", PID, 4)])),
    FrameType.ACK: (wire.encode_ack(CID, COOKIE, 9, 4, [[6, 8]]), (FrameType.ACK, CID, COOKIE, 9, 4, [(6, 8)])),
    FrameType.PING: (wire.encode_ping(CID, COOKIE, 3, 2**64 - 1, 17), (FrameType.PING, CID, COOKIE, 3, 2**64 - 1, 17)),
    FrameType.PONG: (
        wire.encode_pong(3, True, COOKIE, [["t", None, "out_of_capacity"]], 99),
        (FrameType.PONG, 3, True, COOKIE, [("t", None, "out_of_capacity")], 99),
    ),
    FrameType.CANCEL: (wire.encode_cancel("t", None, "unsubscribed"), (FrameType.CANCEL, "t", None, "unsubscribed")),
    FrameType.REDIRECT: (wire.encode_redirect("n2", clustermap.encode(CMAP)), (FrameType.REDIRECT, "n2", CMAP)),
    FrameType.ERROR: (wire.encode_error(ErrorCode.BAD_COOKIE, "send HELLO"),
                      (FrameType.ERROR, ErrorCode.BAD_COOKIE, "send HELLO")),
    FrameType.STATUS: (wire.encode_status(CID, COOKIE), (FrameType.STATUS, CID, COOKIE)),
    FrameType.STATUS_REPLY: (wire.encode_status_reply({"node": "n1", "subscriptions": 3}),
                     (FrameType.STATUS_REPLY, {"node": "n1", "subscriptions": 3})),
    FrameType.MAP: (wire.encode_map_request(CID, COOKIE), (FrameType.MAP, CID, COOKIE)),
    FrameType.PUT: (durablewire.encode_put(CID, COOKIE, PID, 7, 5, 3, [M]),
            (FrameType.PUT, CID, COOKIE, PID, 7, 5, 3, [("t", "k", {"a": "b"}, b"\x00payload")])),
    FrameType.PUTACK: (durablewire.encode_putack(PID, 7, 5, durablewire.PUT_GAP),
                       (FrameType.PUTACK, PID, 7, 5, durablewire.PUT_GAP)),
    FrameType.GET: (durablewire.encode_get(CID, COOKIE, PID, "w", "t", 3, durablewire.START_OFFSET, 9, 50, 12),
            (FrameType.GET, CID, COOKIE, PID, "w", "t", 3, durablewire.START_OFFSET, 9, 50, 12)),
    FrameType.RECORDS: (durablewire.encode_records("w", 3, 12, 15, 0, [[12, 1000, "t", None, None, b"x"]], 2, 40),
                (FrameType.RECORDS, "w", 3, 12, 15, 0, [(12, 1000, "t", None, None, b"x")], 2, 40)),
    FrameType.COMMIT: (durablewire.encode_commit(CID, COOKIE, PID, "w", "t", 3, 15),
               (FrameType.COMMIT, CID, COOKIE, PID, "w", "t", 3, 15)),
    FrameType.COMMITTED: (durablewire.encode_committed("w", 3, 15, 0), (FrameType.COMMITTED, "w", 3, 15, 0)),
    FrameType.BYE: (wire.encode_bye(CID, COOKIE, 2**63 - 1), (FrameType.BYE, CID, COOKIE, 2**63 - 1)),
    FrameType.PUBRUN: (wire.encode_pubrun(CID, COOKIE, PID, 5, "t", [b"a", b"", b"\xff" * 255]),
               (FrameType.PUBRUN, CID, COOKIE, PID, 5, "t", [b"a", b"", b"\xff" * 255])),
    FrameType.MSGSRUN: (wire.msgsrun_header(2**64 - 1) + wire.run_body("t", [b"a", b"b"])[1],
                (FrameType.MSGSRUN, 2**64 - 1, "t", [b"a", b"b"])),
}  # fmt: skip


def test_every_frame_type_is_covered():
    assert set(EVERY_FRAME) == set(FrameType)


@pytest.mark.parametrize("ftype", list(FrameType), ids=lambda t: t.name)
def test_round_trip(ftype):
    data, expected = EVERY_FRAME[ftype]
    assert data[0] & 0xF0 == 0x90  # binary frames never start with a letter
    assert decoding.decode_untrusted_frame(data) == expected


def test_hello_is_padded_for_the_amplification_budget():
    assert len(wire.encode_hello(CID)) == wire.HELLO_PAD_TO


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\xc1", ErrorCode.MALFORMED),  # never-used msgpack byte
        (msgpack.packb({"a": 1}), ErrorCode.MALFORMED),
        (msgpack.packb([1]), ErrorCode.MALFORMED),
        (msgpack.packb([2, 1, CID, b""]), ErrorCode.UNSUPPORTED_VERSION),
        (msgpack.packb([1, 99]), ErrorCode.UNKNOWN_TYPE),
        (msgpack.packb([1, FrameType.HELLO]), ErrorCode.MALFORMED),
        (msgpack.packb([1, FrameType.PING, b"short", COOKIE, 1, 0, 0]), ErrorCode.MALFORMED),
        (msgpack.packb([1, FrameType.PING, CID, COOKIE, -1, 0, 0]), ErrorCode.MALFORMED),
        (msgpack.packb([1, FrameType.PING, CID, COOKIE, 1, -1, 0]), ErrorCode.MALFORMED),  # digest
        (msgpack.packb([1, FrameType.PING, CID, COOKIE, 1, 0, "1"]), ErrorCode.MALFORMED),  # session
        (
            msgpack.packb([1, FrameType.PING, CID, COOKIE, 1]),
            ErrorCode.MALFORMED,
        ),  # the old PING, without digest and session
        (msgpack.packb([1, FrameType.PONG, 1, True, COOKIE, [], 1.5]), ErrorCode.MALFORMED),  # digest
        (msgpack.packb([1, FrameType.CMDS, CID, COOKIE, 1, 1, [[1, 7, None, 0]]]), ErrorCode.BAD_TOPIC),
        (msgpack.packb([1, FrameType.CMDS, CID, COOKIE, 1, 1, [[1, "x" * 1025, None, 0]]]), ErrorCode.BAD_TOPIC),
        (msgpack.packb([1, FrameType.CMDS, CID, COOKIE, 1, 1, [[1, "", None, 0]]]), ErrorCode.BAD_TOPIC),
        (msgpack.packb([1, FrameType.CMDS, CID, COOKIE, 1, 1, [[1, "t", 5, 0]]]), ErrorCode.BAD_KEY),
        (msgpack.packb([1, FrameType.CMDS, CID, COOKIE, 1, 1, [[1, "t", None, 7]]]), ErrorCode.BAD_MODE),
        (msgpack.packb([1, FrameType.CMDS, CID, COOKIE, 1, [[1, "t", None, 0]]]), ErrorCode.MALFORMED),  # no session
        (msgpack.packb([1, FrameType.CMDS, CID, COOKIE, -1, 1, []]), ErrorCode.MALFORMED),
        (msgpack.packb([1, FrameType.CMDACK, 1, [0]]), ErrorCode.MALFORMED),  # no session
        (msgpack.packb([1, FrameType.CMDACK, "1", 1, [0]]), ErrorCode.MALFORMED),
        (
            msgpack.packb([1, FrameType.PUB, CID, COOKIE, PID, 1, 1, True, [["t", None, {"a": 1}, b""]]]),
            ErrorCode.BAD_TAGS,
        ),
        (
            msgpack.packb([1, FrameType.PUB, CID, COOKIE, PID, 1, 1, True, [["t", None, None, "str"]]]),
            ErrorCode.MALFORMED,
        ),
        (msgpack.packb([1, FrameType.PUB, CID, COOKIE, PID, 1, 1, True, []]), ErrorCode.MALFORMED),
        (b"\x94\x01\x09\xa2\xff\xfe", ErrorCode.BAD_UTF8),
        (msgpack.packb([1, FrameType.ACK, CID, COOKIE, 1, 1, [[5, 2]]]), ErrorCode.MALFORMED),
        (msgpack.packb([1, FrameType.PUBRUN, CID, COOKIE, PID, 1, "t", []]), ErrorCode.MALFORMED),  # no payload
        (msgpack.packb([1, FrameType.PUBRUN, CID, COOKIE, PID, 1, "t", [b"a", "str"]]), ErrorCode.MALFORMED),
        (
            msgpack.packb([1, FrameType.PUBRUN, CID, COOKIE, PID, 1, "t", [b"a", b"x" * 256]]),
            ErrorCode.MALFORMED,
        ),  # too long
        (msgpack.packb([1, FrameType.PUBRUN, CID, COOKIE, PID, 1, "t.*", [b"a"]]), ErrorCode.BAD_TOPIC),
        (
            msgpack.packb([1, FrameType.PUBRUN, CID, COOKIE, PID, 2**64 - 1, "t", [b"a", b"b"]]),
            ErrorCode.MALFORMED,
        ),  # seq past 2**64
        (
            msgpack.packb([1, FrameType.PUBRUN, CID, COOKIE, PID, 1, 1, True, "t", [b"a"]]),
            ErrorCode.MALFORMED,
        ),  # a PUB's fields
        (msgpack.packb([1, FrameType.MSGSRUN, 1, "t", []]), ErrorCode.MALFORMED),
        (msgpack.packb([1, FrameType.MSGSRUN, 1, "a b", [b"a"]]), ErrorCode.BAD_TOPIC),
        (msgpack.packb([1, FrameType.MSGSRUN, -1, "t", [b"a"]]), ErrorCode.MALFORMED),
        (msgpack.packb([1, FrameType.MSGSRUN, 1, "t", [[b"a"]]]), ErrorCode.MALFORMED),
    ],
)
def test_decode_errors(data, code):
    with pytest.raises(WireError) as exc:
        decoding.decode_untrusted_frame(data)
    assert exc.value.code == code


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_only_ever_raise_wire_error(data):
    assert isinstance(outcome(decoding.decode_untrusted_frame, data), tuple | WireError)
    assert isinstance(outcome(parse_untrusted_text, data), tuple | WireError)


_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=20)
    | st.binary(max_size=20) | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)  # fmt: skip


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(list(FrameType)), st.lists(_value, max_size=9))
def test_structured_garbage_only_ever_raises_wire_error(ftype, fields):
    data = msgpack.packb([1, int(ftype), *fields])
    assert isinstance(outcome(decoding.decode_untrusted_frame, data), tuple | WireError)


def outcome(fn, data):
    """The decoder's result or its WireError; any other exception fails the test."""
    try:
        return fn(data)
    except WireError as exc:
        return exc


def test_text_msg_format():
    assert encode_text_msg("t1", b"hello world  ") == b"MSG t1\nhello world  "


def welcome(members, node_id="n1"):
    return msgpack.packb([1, FrameType.WELCOME, node_id, COOKIE, {}, members])


GOOD_MEMBER = ["n1", "127.0.0.1", 7400]


@pytest.mark.parametrize(
    "members",
    [
        [["n1", "127.0.0.1"]],  # not [id, host, port]
        [["n1", "127.0.0.1", 7400, 1]],
        ["n1"],
        [["", "127.0.0.1", 7400]],  # empty id
        [["n" * 65, "127.0.0.1", 7400]],  # id too long
        [[b"n1", "127.0.0.1", 7400]],  # id not a str
        [["n1", "example.com", 7400]],  # a host name, not an IP literal
        [["n1", "127.0.0.1\x00", 7400]],
        [["n1", "127.0.0.256", 7400]],
        [["n1", "", 7400]],
        [["n1", b"127.0.0.1", 7400]],
        [["n1", "1" * 100, 7400]],
        [["n1", "127.0.0.1", 0]],  # port out of range
        [["n1", "127.0.0.1", 65536]],
        [["n1", "127.0.0.1", -1]],
        [["n1", "127.0.0.1", True]],
        [["n1", "127.0.0.1", 7400.0]],
        [GOOD_MEMBER, ["n2", "127.0.0.1", 70000]],  # one bad member spoils the map
        [[f"n{i}", "127.0.0.1", 7400 + i] for i in range(65)],  # too many
        {"n1": 1},
    ],
)
def test_welcome_with_a_bad_cluster_map_is_malformed(members):
    with pytest.raises(WireError) as exc:
        decoding.decode_untrusted_frame(welcome(members))
    assert exc.value.code == ErrorCode.MALFORMED


def test_a_welcome_carries_the_cluster_map_in_params_and_the_decoder_places_it():
    params = {"max_datagram": 1500, "map_epoch": 4, "map": clustermap.encode(CMAP)}
    f = decoding.decode_untrusted_frame(wire.encode_welcome("n1", COOKIE, params, [["n1", "127.0.0.1", 7401]]))
    assert f[3] == {"max_datagram": 1500, "map_epoch": 4} and f[5] == CMAP


@pytest.mark.parametrize("params", [
    {"map": clustermap.encode(CMAP)[:4]},  # one bad map spoils the WELCOME
    {"map": "n1"},
    {"map_epoch": -1},
    {"map_epoch": "4"},
])  # fmt: skip
def test_a_welcome_with_a_bad_map_is_malformed(params):
    with pytest.raises(WireError) as exc:
        decoding.decode_untrusted_frame(msgpack.packb([1, FrameType.WELCOME, "n1", COOKIE, params, []]))
    assert exc.value.code == ErrorCode.MALFORMED


@pytest.mark.parametrize("fields", [
    ["n2"], ["n2", clustermap.encode(CMAP), 1], ["", clustermap.encode(CMAP)], ["n2", [1, 4, 16, 2, []]],
    ["n2", None], [7, clustermap.encode(CMAP)],
])  # fmt: skip
def test_a_malformed_redirect_is_refused(fields):
    with pytest.raises(WireError):
        decoding.decode_untrusted_frame(msgpack.packb([1, FrameType.REDIRECT, *fields]))


@pytest.mark.parametrize("node_id", ["", "n" * 65, 7, None])
def test_welcome_with_a_bad_node_id_is_malformed(node_id):
    with pytest.raises(WireError) as exc:
        decoding.decode_untrusted_frame(welcome([GOOD_MEMBER], node_id))
    assert exc.value.code == ErrorCode.MALFORMED


def test_welcome_accepts_the_limits():
    members = [[f"n{i}", "127.0.0.1", 1 + i] for i in range(63)] + [["m" * 64, "::1", 65535]]
    f = decoding.decode_untrusted_frame(welcome(members, "n" * 64))
    assert f[1] == "n" * 64 and len(f[4]) == 64 and f[4][-1] == ("m" * 64, "::1", 65535)
    assert decoding.decode_untrusted_frame(welcome([]))[4] == []


@pytest.mark.parametrize("ftype", [True, 1.0, "1", None, [1]])
def test_frame_type_must_be_a_plain_integer(ftype):
    with pytest.raises(WireError) as exc:
        decoding.decode_untrusted_frame(msgpack.packb([1, ftype, CID, b"\0" * 200]))
    assert exc.value.code == ErrorCode.UNKNOWN_TYPE


def test_field_count_error_names_the_frame():
    with pytest.raises(WireError) as exc:
        decoding.decode_untrusted_frame(msgpack.packb([1, FrameType.CMDACK, 1, [0]]))  # the old CMDACK, no session
    assert (exc.value.code, exc.value.text) == (ErrorCode.MALFORMED, "CMDACK has 3 fields, got 2")


@pytest.mark.parametrize(
    "frame",
    [
        [1, FrameType.CMDS, CID, COOKIE, -1, 1, []],
        [1, FrameType.CMDS, CID, COOKIE, 1, 1.5, []],
        [1, FrameType.CMDS, CID, COOKIE, "1", 1, []],
        [1, FrameType.CMDACK, 1, -1, []],
        [1, FrameType.CMDACK, True, 1, []],
        [1, FrameType.CMDACK, 1, 1, ["ok"]],
    ],
)
def test_session_and_batch_are_uint64(frame):
    with pytest.raises(WireError) as exc:
        decoding.decode_untrusted_frame(msgpack.packb(frame))
    assert exc.value.code == ErrorCode.MALFORMED


def test_runs_fill_each_datagram_and_keep_the_order():
    """wire.runs (PUB and MSGS batches): every message once, in order; each run within the
    budget unless it is one message; the next message would not have fitted."""
    sizes = [30, 30, 30, 100, 5, 5, 200, 1, 60, 40]
    packed = [b"x" * n for n in sizes]
    cuts = list(wire.runs(packed, 100))
    assert cuts == [(0, 3), (3, 4), (4, 6), (6, 7), (7, 9), (9, 10)]
    for start, end in cuts:
        total = sum(sizes[start:end])
        assert total <= 100 or end - start == 1
        assert end == len(sizes) or total + sizes[end] > 100
    assert list(wire.runs([], 100)) == []


@pytest.mark.parametrize("bad", [
    ["t", None, None, b"x", b"p" * 15, 1],  # short producer id
    ["t", None, None, b"x", b"p" * 16, -1],  # negative sequence
    ["t", None, None, b"x", b"p" * 16, 1.0],  # not an integer
    ["t", None, None, "text", b"p" * 16, 1],  # payload not bytes
    ["t x", None, None, b"x"],  # a topic with whitespace (not a known one)
])  # fmt: skip
def test_msgs_refuses_a_malformed_message_that_looks_like_a_plain_one(bad):
    wire.check_topic("t")  # (a known topic: the one-expression check applies)
    frame = msgpack.packb([wire.VERSION, FrameType.MSGS, 1, 1, [bad]])
    with pytest.raises(WireError):
        decoding.decode_untrusted_frame(frame)


@pytest.mark.parametrize("bad", [
    ["t", None, None, "text"],  # payload not bytes
    ["t", "", None, b"x"],  # an empty key
    ["t", None, [], b"x"],  # tags not a map
    ["t x", None, None, b"x"],  # a topic with whitespace (not a known one)
    ["t", None, None, b"x", b"p" * 15, 1],  # the longer shape, with a short producer id
])  # fmt: skip
def test_pub_refuses_a_malformed_message_that_looks_like_a_plain_one(bad):
    wire.check_topic("t")  # (a known topic: the one-expression check applies)
    frame = msgpack.packb([wire.VERSION, FrameType.PUB, b"c" * 16, b"k" * 16, b"p" * 16, 1, 1, True, [bad]])
    with pytest.raises(WireError):
        decoding.decode_untrusted_frame(frame)


@pytest.mark.parametrize("topic", ["t", "a.b", "x" * 31, "y" * 32, "z" * 255, "é" * 100])
@pytest.mark.parametrize("size", [0, 1, 255, 256, 65535, 65536])
def test_pack_plain_is_pack_message_byte_for_byte(topic, size):
    """The publisher's hot path packs a plain message's head once per topic; its bytes must be
    msgpack's, whatever the topic's and the payload's length (str and bin header sizes)."""
    payload = bytes(range(256)) * (size // 256) + b"p" * (size % 256)
    assert wire.pack_plain(topic, payload) == wire.pack_message(topic, None, None, payload)
    assert wire.pack_plain(topic, payload) == wire.pack_message(topic, None, None, payload)  # (its head cached)


_PACKED = st.tuples(st.sampled_from(["t", "a.b", "é" * 40, "z" * 255]), st.sampled_from([None, "k"]),
                    st.sampled_from([None, {"a": "b"}]),
                    st.sampled_from([0, 1, 255, 256, 65536]).map(lambda n: b"p" * n))  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(_PACKED, max_size=12), st.sampled_from([None, b"p" * 16]),
       st.sampled_from([0, 1, 127, 128, 2**16 - 3, 2**32 - 3, 2**64 - 13]))  # fmt: skip
def test_pack_messages_is_pack_message_and_pack_delivery_byte_for_byte(msgs, pid, first):
    """The node packs each PUB's messages with ``pack_messages``: a plain one from its topic's
    cached head. Its bytes must be ``pack_message``'s (fire) or ``pack_delivery``'s (reliable,
    the sequences from ``first``: every msgpack int width), in any mix of topics and shapes."""
    want = [
        wire.pack_message(t, k, g, p) if pid is None else wire.pack_delivery(t, k, g, p, pid, s)
        for s, (t, k, g, p) in enumerate(msgs, first)
    ]
    assert wire.pack_messages(msgs, pid, first) == want
    assert wire.pack_messages(msgs, pid, first) == want  # (the heads cached)


def test_pack_messages_keeps_at_most_plain_heads_topics(monkeypatch):
    monkeypatch.setattr(wire, "PLAIN_HEADS", 3)
    monkeypatch.setattr(wire, "_delivery_heads", {})
    msgs = [(f"t{i}", None, None, b"x") for i in range(7)]
    want = [wire.pack_delivery(*m, b"p" * 16, s) for s, m in enumerate(msgs, 1)]
    assert wire.pack_messages(msgs, b"p" * 16, 1) == want
    assert len(wire._delivery_heads) <= 3


@pytest.mark.parametrize("topic", ["", "a b", "a.*", "x" * 256, 7, None])
def test_pack_plain_checks_the_topic(topic):
    with pytest.raises(WireError) as e:
        wire.pack_plain(topic, b"x")
    assert e.value.code == ErrorCode.BAD_TOPIC
    assert topic not in wire._plain_heads


_ATOMS = st.sampled_from(["t", "t x", "", "u", 5, -1, None, True, 1.0, 2**64, b"t", b"p" * 16, b"p" * 15,
                          b"m" * wire.MARK_LEN, {}, {"a": "b"}, {"a": 1}, [], [b"m" * wire.MARK_LEN]])  # fmt: skip
_MESSAGES = st.one_of(st.lists(_ATOMS, min_size=0, max_size=8), _ATOMS,
                      st.lists(_ATOMS, min_size=4, max_size=7).map(tuple))  # fmt: skip


def _outcome(check, m):
    try:
        return ("ok", check(m))
    except WireError as e:
        return ("refused", e.code)


@settings(max_examples=400, deadline=None)
@given(m=_MESSAGES, known=st.booleans())
def test_the_decoders_loops_accept_exactly_what_the_full_validators_accept(m, known):
    """``_checked`` checks the common message of a MSGS or a PUB in its own loop; whatever a
    peer sends, the outcome must be the full validator's: the same tuple, or a refusal with the
    same code. With the topic known (memoised) and not."""
    wire._valid_topics.clear()
    if known:
        wire.check_topic("t")
    # (in the containers decoding makes: a list-decoded frame's lists, msgpack's tuples, and a mix)
    as_tuple = tuple(m) if isinstance(m, list) else m
    for msgs in ([m], (m,), (as_tuple,)):
        want = _outcome(wire.check_delivered, msgs[0])
        assert _outcome(lambda x: decoding._checked(x, True)[0], msgs) == want
        want = _outcome(wire.check_message, msgs[0])
        assert _outcome(lambda x: decoding._checked(x, False)[0], msgs) == want


def test_a_list_message_among_msgpacks_tuples_comes_out_a_checked_tuple():
    """Only msgpack's own tuples are kept as they are: a list message (not from a tuple-decoded
    frame) is checked into a tuple like any other, wherever it stands."""
    wire.check_topic("t")
    plain = ("t", None, None, b"x")
    for msgs in ((["t", None, None, b"x"],), (plain, ["t", None, None, b"y"]), (["t", None, None, b"y"], plain)):
        out = decoding._checked(msgs, True)
        assert all(m.__class__ is tuple for m in out) and out == [tuple(m) for m in msgs]


def _decoded(data, as_lists):
    """``decode_untrusted_frame``'s outcome, or with ``as_lists`` the validator's on the frame
    msgpack made with lists (every frame but PUB and MSGS is decoded so)."""
    try:
        if not as_lists:
            return ("ok", decoding.decode_untrusted_frame(data))
        frame = msgpack.unpackb(data, raw=False, strict_map_key=True)
        return ("ok", decoding._DECODERS[frame[1]][2](frame))
    except WireError as e:
        return ("refused", e.code)


#: Messages of the common shape and just off it, which the decoders' own loops take or pass on.
_NEAR_PLAIN = st.tuples(st.sampled_from(["t", "t x", "", "u", 5]), st.sampled_from([None, None, "", "k", 1]),
                        st.sampled_from([None, None, {}, {"a": "b"}, []]), st.sampled_from([b"x", b"", "x", None]),
                        st.sampled_from([(), (), (b"p" * 16, 1), (b"p" * 15, 1), (b"p" * 16, -1), (b"p" * 16, 1.0),
                                         (b"p" * 16, 1, [b"m" * wire.MARK_LEN]), ([b"m" * wire.MARK_LEN],)]),
                        ).map(lambda t: [*t[:4], *t[4]])  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(msgs=st.lists(st.one_of(_NEAR_PLAIN, _NEAR_PLAIN, _MESSAGES), min_size=1, max_size=5), known=st.booleans(),
       stream=st.sampled_from([0, 3]))  # fmt: skip
def test_pub_and_msgs_decoded_as_tuples_come_out_as_from_lists(msgs, known, stream):
    """PUB and MSGS are unpacked with their arrays as tuples (decoding._AS_TUPLES), every
    other frame with lists. Whatever messages a peer sends in them, the outcome must be the
    one the validators give the same frame made of lists: the same fields (messages as
    tuples, a queue group's marks as a list), or a refusal with the same code."""
    wire._valid_topics.clear()
    if known:
        wire.check_topic("t")
    for frame in ([wire.VERSION, FrameType.MSGS, stream, 1, msgs],
                  [wire.VERSION, FrameType.PUB, b"c" * 16, b"k" * 16, b"p" * 16, 1, 1, True, msgs]):  # fmt: skip
        try:
            data = msgpack.packb(frame)
        except OverflowError:  # (an atom of 2**64: msgpack cannot send it)
            assume(False)
        assert data[:3] in decoding._AS_TUPLES
        assert _decoded(data, False) == _decoded(data, True)


def test_only_pub_and_msgs_are_decoded_as_tuples():
    """A frame whose first bytes are not exactly a PUB's or a MSGS's keeps its lists: a CMDACK
    (whose results are returned as they came) and a MSGS of the wrong length, refused."""
    cmdack = decoding.decode_untrusted_frame(msgpack.packb([wire.VERSION, FrameType.CMDACK, 1, 2, [0, 1]]))
    assert cmdack == (FrameType.CMDACK, 1, 2, [0, 1])
    with pytest.raises(WireError, match="MSGS has 3 fields, got 4"):
        decoding.decode_untrusted_frame(msgpack.packb([wire.VERSION, FrameType.MSGS, 0, 0, [], 5]))
    msgs = wire.encode_msgs(0, 0, [wire.pack_plain("t", b"x")])  # (a datagram in a buffer: the same)
    for data in (msgs, bytearray(msgs), memoryview(msgs)):
        assert decoding.decode_untrusted_frame(data) == (FrameType.MSGS, 0, 0, [("t", None, None, b"x")])  # type: ignore[arg-type]


def test_the_checks_that_take_msgpacks_tuples_are_not_annotated_list():
    """scripts/benchnative.py compiles this module with mypyc, which checks a ``list[...]``
    parameter at run time: a function that gets a PUB's or a MSGS's tuples (_AS_TUPLES) must
    not say ``list``, or the compiled build refuses every such frame (mypy cannot see it: the
    table's validators take Any)."""
    for fn in (decoding._pub, decoding._msgs, decoding._checked, decoding._batch, decoding._last_seq,
               decoding._array, wire.check_message, wire.check_delivered):  # fmt: skip
        for name, param in inspect.signature(fn).parameters.items():
            assert not str(param.annotation).startswith("list"), (fn.__name__, name, param.annotation)


def test_sequences_past_2_63_are_refused_in_pub_put_and_reliable_msgs_only():
    """The last sequence of a PUB, a PUT or a reliable MSGS (first + messages - 1) must be
    below 2**63 (wire.SEQ_LIMIT): one past a uint64 crashed the process packing it, and a node's
    counters of such differences must stay in msgpack's range. A fire MSGS's first_seq numbers
    the datagram, so it is not checked that way."""
    top, ids, m = wire.SEQ_LIMIT - 1, b"i" * 16, [wire.pack_message("t", None, None, b"x")]
    frames = {
        "PUB": lambda first, n: wire.encode_pub(ids, ids, ids, first, 1, True, m * n),
        "PUT": lambda first, n: durablewire.encode_put(ids, ids, ids, 0, first, 1, m * n),
        "MSGS": lambda first, n: wire.encode_msgs(7, first, m * n),
    }
    for name, frame in frames.items():
        assert decoding.decode_untrusted_frame(frame(top - 1, 2))[0].name == name  # (up to 2**63 - 1)
        with pytest.raises(WireError, match="below 2"):
            decoding.decode_untrusted_frame(frame(top, 2))
    assert decoding.decode_untrusted_frame(wire.encode_msgs(0, top, m * 2))[3] == [("t", None, None, b"x")] * 2
