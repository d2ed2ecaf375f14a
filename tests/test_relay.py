"""A node relaying a fire PUB's array of messages as the datagram carried it (node/producers.py,
``_as_sent``): the core driven directly, each case against the same PUB taken one message at a
time (a wildcard subscription elsewhere on the node turns the relay off), which packs every
message again."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgpack
import pytest

from roost.client import decoding, wire
from roost.client.wire import FrameType, Mode
from tests.corekit import PAD, FakeClient, connect, frames_to, make_core, sends

A = ("127.0.0.1", 5001)  # a fire subscriber
B = ("127.0.0.1", 5002)  # a reliable one
C = ("127.0.0.1", 5003)  # the publisher
D = ("127.0.0.1", 5004)  # a text subscriber
E_ = ("127.0.0.1", 5005)  # a wildcard subscriber (of another topic)


def _pub_data(pub: FakeClient, packed: list[bytes], long_first: bool = False) -> bytes:
    """A fire PUB of ``packed`` from ``pub``; with ``long_first`` its first sequence written as a
    uint64 (valid msgpack, not the shortest form)."""
    data = wire.encode_pub(pub.cid, pub.cookie, pub.pid, 1, 1, False, packed)
    if long_first:
        head = wire.pub_header(pub.cid, pub.cookie, pub.pid, 1, 1, False)
        at = head.index(b"\x01\x01\xc2")  # (first, floor, reliable: each one byte when short)
        data = head[:at] + b"\xcf" + (1).to_bytes(8, "big") + head[at + 1 :] + data[len(head) :]
    return data


class Got(NamedTuple):
    fire: list[tuple[Any, ...]]  # the messages a fire subscriber got
    reliable: list[tuple[Any, ...]]  # and a reliable one
    text: list[bytes]  # the datagrams a text subscriber got
    delivered: int  # the node's count
    fire_data: list[bytes]  # the datagrams the fire subscriber got
    array: bytes  # the PUB's array of messages, as it carried it


def _relay(packed: list[bytes], as_run: bool, long_first: bool = False) -> Got:
    """What a fire, a reliable and a text subscriber of "t" get from one fire PUB of ``packed``."""
    core = make_core()
    fire, rel, pub, other = connect(core, A, B, C, E_)
    fire.sub("t", mode=Mode.FIRE)
    rel.sub("t")
    core.handle_datagrams([(b"SUB t\n" + PAD, D)], 0.0)
    if not as_run:
        other.sub("x.>")
    data = _pub_data(pub, packed, long_first)
    assert decoding.decode_untrusted_frame(data)[4] == 1  # (the long form decodes as the short one)
    out = pub.send(data, 0.0)

    def got(addr: tuple[str, int]) -> list[tuple[Any, ...]]:
        return [tuple(m) for f in frames_to(out, addr) if f[0] is FrameType.MSGS for m in f[3]]

    return Got(got(A), got(B), [s.data for s in sends(out) if s.addr == D], core.metrics["delivered"],
               [s.data for s in sends(out) if s.addr == A],
               data[len(wire.pub_header(pub.cid, pub.cookie, pub.pid, 1, 1, False)) :])  # fmt: skip


def _bin16(i: int) -> bytes:
    """``["t", nil, nil, payload]`` with its payload in a bin 16 (valid, not the shortest form)."""
    p = b"%02d" % i
    return b"\x94\xa1t\xc0\xc0\xc5" + len(p).to_bytes(2, "big") + p


CASES = {
    "plain": [wire.pack_message("t", None, None, b"%d" % i) for i in range(20)],
    "long payloads": [_bin16(i) for i in range(20)],
    "tags": [wire.pack_message("t", None, {"n": str(i)}, b"%d" % i) for i in range(20)],
    "key": [wire.pack_message("t", "k", None, b"%d" % i) for i in range(20)],
    "producer ids": [msgpack.packb(["t", None, None, b"%d" % i, b"p" * 16, i + 1]) for i in range(20)],
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("long_first", [False, True])
def test_a_relayed_fire_datagram_is_delivered_as_one_message_at_a_time_is(case: str, long_first: bool) -> None:
    run = _relay(CASES[case], as_run=True, long_first=long_first)
    each = _relay(CASES[case], as_run=False, long_first=long_first)
    assert run[:4] == each[:4]  # (fire, reliable, text, delivered)
    payloads = [b"%02d" % i if case == "long payloads" else b"%d" % i for i in range(20)]
    assert [m[3] for m in run.fire] == [m[3] for m in run.reliable] == payloads
    assert all(len(m) == 4 for m in run.fire)  # (no producer id from a publisher)
    assert len(run.text) == 20
    if case == "long payloads":  # (packed again they would be shorter: the bytes tell which way they went)
        assert [d.endswith(run.array) for d in run.fire_data] == [not long_first]


def test_the_relay_is_what_the_messages_bytes_say() -> None:
    """Payloads in a longer msgpack form than the node's own packing: relayed as they came, so
    the subscriber's datagram is not what packing each message again would make, and it
    decodes to the same messages."""
    run = _relay(CASES["long payloads"], as_run=True)
    (data,) = run.fire_data
    assert data.endswith(b"".join(CASES["long payloads"]))
    assert [m[3] for m in run.fire] == [b"%02d" % i for i in range(20)]


def test_single_messages_queued_before_a_run_go_out_first_and_a_run_before_them() -> None:
    """Within one batch a fire subscriber gets its messages in the order they came, whether a
    relayed array or single messages (a PUB of one) came first."""
    core = make_core()
    fire, pub = connect(core, A, C)
    fire.sub("t", mode=Mode.FIRE)

    def pubs(*sizes: int) -> list[tuple[bytes, tuple[str, int]]]:
        out, seq = [], pub.seq
        for n in sizes:
            packed = [wire.pack_message("t", None, None, b"%d" % (seq + i)) for i in range(n)]
            out.append((wire.encode_pub(pub.cid, pub.cookie, pub.pid, seq, seq, False, packed), C))
            seq += n
        pub.seq = seq
        return out

    for sizes in [(1, 5, 1), (5, 1, 5), (5, 5)]:
        first = pub.seq
        out = core.handle_datagrams(pubs(*sizes), 1.0)
        got = [m[3] for f in frames_to(out, A) if f[0] is FrameType.MSGS for m in f[3]]
        assert got == [b"%d" % i for i in range(first, pub.seq)], sizes


def test_a_relayed_datagram_of_the_largest_pub_fits_in_max_datagram() -> None:
    core = make_core(max_datagram=2000)
    fire, pub = connect(core, A, C)
    fire.sub("t", mode=Mode.FIRE)
    packed = [wire.pack_message("t", None, None, b"x" * 100) for _ in range(18)]
    size = len(wire.encode_pub(pub.cid, pub.cookie, pub.pid, 1, 1, False, packed))
    packed.append(wire.pack_message("t", None, None, b"y" * (2000 - size - 7)))  # (its head: 7 bytes)
    data = wire.encode_pub(pub.cid, pub.cookie, pub.pid, 1, 1, False, packed)
    assert len(data) == 2000
    (msgs,) = [s.data for s in sends(pub.send(data, 0.0)) if s.addr == A]
    assert len(msgs) <= 2000 and msgs.endswith(b"".join(packed))


@pytest.mark.parametrize("sizes", [(5,), (1,)])
def test_a_subscriber_that_leaves_in_the_same_batch_is_sent_nothing(sizes: tuple[int, ...]) -> None:
    """A PUB relayed (5 messages) or queued as a single message (1) for a fire subscriber whose
    BYE comes next in the same batch: nothing goes to its address."""
    core = make_core()
    fire, pub = connect(core, A, C)
    fire.sub("t", mode=Mode.FIRE)
    packed = [wire.pack_message("t", None, None, b"m")] * sizes[0]
    out = core.handle_datagrams([(_pub_data(pub, packed), C),
                                 (wire.encode_bye(fire.cid, fire.cookie, fire.session), A)], 1.0)  # fmt: skip
    assert [f[0] for f in frames_to(out, A)] == []
