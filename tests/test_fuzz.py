"""Random and mutated datagrams never crash a core and never change its state.

The only datagrams allowed to change state are those that the real decoders
accept as a command from a validated source (cookie) or, for text, from a text
network; for those nothing is checked here: what a command changes is tested in
test_core.py.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roost.client import decoding, wire
from roost.client.text import parse_untrusted_text
from roost.client.wire import T, WireError
from tests.corekit import connect, make_core, random_datagram, sends

A = ("127.0.0.1", 5001)
B = ("127.0.0.1", 5002)
FAR = ("198.51.100.7", 4000)


def populated():
    core = make_core(mailbox_capacity=64, send_window=16)
    sub, pub = connect(core, A, B)
    sub.cmds([(1, "t", None, 1), (1, "t", "k", 0), (1, "u", None, 0)])
    core.handle_datagrams([(b"SUB t\n", ("127.0.0.1", 5009))], 0.0)
    pub.pub([("t", b"x"), ("u", b"y")])
    return core, sub, pub


def legit_change(core, data: bytes, addr) -> bool:
    """Would this datagram be accepted as a state-changing command?"""
    if data and (0x41 <= data[0] <= 0x5A or 0x61 <= data[0] <= 0x7A):
        try:
            verb, topic, _ = parse_untrusted_text(data)
            wire.check_topic(topic)
        except WireError:
            return False
        return verb in ("SUB", "UNSUB") and core._text_allowed(addr[0])
    try:
        f = decoding.decode_untrusted_frame(data, core.cfg.max_datagram)
    except WireError:
        return False
    if f[0] not in (T.CMDS, T.PUB, T.PUBRUN, T.ACK, T.PING):
        return False
    return core.cookies.check(addr, f[1], f[2], 0.0)


def check_one(core, data: bytes, addr) -> None:
    before = core.state_digest()
    allowed = legit_change(core, data, addr)
    out = core.handle_datagrams([(data, addr)], 0.0)  # must not raise
    for s in sends(out):  # (and what it sends is valid: a relayed batch is what was checked)
        if s.data[:1] and 0x90 <= s.data[0] <= 0x9F:
            decoding.decode_untrusted_frame(s.data, core.cfg.max_datagram)
    core.tick(0.0)
    if not allowed:
        assert core.state_digest() == before, data


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200), st.sampled_from([A, B, FAR]))
def test_random_datagrams(data, addr):
    core, _, _ = populated()
    check_one(core, data, addr)


def _valid_frames(sub, pub):
    return [
        wire.encode_cmds(sub.cid, sub.cookie, sub.session, 50, [(1, "t2", None, 1), (0, "t", None, 0)]),
        wire.encode_pub(pub.cid, pub.cookie, pub.pid, 3, 3, True, [wire.pack_message("t", "k", {"a": "b"}, b"zz")]),
        wire.encode_pubrun(pub.cid, pub.cookie, pub.pid, 5, "u", [b"r1", b"r2"]),
        wire.encode_pub(pub.cid, pub.cookie, pub.pid, 7, 7, False, [wire.pack_message("u", None, None, b"f")] * 3),
        wire.encode_ack(sub.cid, sub.cookie, 65537, 1, [[3, 4]]),
        wire.encode_ping(sub.cid, sub.cookie, 9),
        wire.encode_hello(sub.cid),
        b"SUB t9\n",
        b"PUB t\nbody",
        b"UNSUB t\n",
    ]


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 9), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10_000), st.integers(0, 255)),
                                  min_size=1, max_size=4), st.sampled_from([A, B, FAR]))
def test_mutated_datagrams(which, mutations, addr):
    core, sub, pub = populated()
    data = bytearray(_valid_frames(sub, pub)[which])
    for op, pos, byte in mutations:
        pos %= max(1, len(data))
        if op == 0 and data:
            data[pos] = byte
        elif op == 1:
            data.insert(pos, byte)
        elif op == 2 and data:
            del data[pos]
        else:
            del data[pos:]
    check_one(core, bytes(data), addr)


def test_a_long_random_stream_keeps_the_core_serving():
    core, sub, pub = populated()
    rng = random.Random(7)
    frames = _valid_frames(sub, pub)
    for _ in range(20_000):
        data = random_datagram(rng, frames, max_len=60, max_flips=3, random_share=0.5)
        core.handle_datagrams([(data, rng.choice([A, B, FAR]))], 0.0)
    # still serves the FASTPUSS line
    c = ("127.0.0.1", 5555)
    core.handle_datagrams([(b"SUB fresh\n", c)], 1.0)
    out = core.handle_datagrams([(b"PUB fresh\nhello world  ", B)], 1.0)
    assert [(s.addr, s.data) for s in out if s.addr == c] == [(c, b"MSG fresh\nhello world  ")]
