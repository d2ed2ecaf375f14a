"""A binary client as the fuzz targets play it, and the frames it sends, built with the real
encoders (client/wire.py, client/durablewire.py) from its state: valid in context (its cookie,
its next sequences, the stream the node numbers its messages in), so that a mutation of one
field reaches the code behind the cookie check and the sequence checks.

A template sent as a legitimate frame moves the client on as a real client would (sequences,
batches); the same template mutated leaves it as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from roost.client import durablewire, wire
from roost.client.wire import ErrorCode, FrameType

Addr = tuple[str, int]


class BinClient:
    """One binary client: its ids, cookie, session and batches, producers, and what the node
    sent it (the reliable stream to acknowledge, the PUBACKs)."""

    def __init__(self, n: int, addr: Addr) -> None:
        self.n = n
        self.addr = addr
        self.cid = bytes([0xC0 + n]) * 16
        self.pid = bytes([0xA0 + n]) * 16  # reliable producer
        self.fpid = bytes([0xF0 + n]) * 16  # fire producer
        self.cookie = b"\x00" * 16
        self.session = 1
        self.batch = 0
        self.seq = 1
        self.fseq = 1
        self.acked = 0
        self.stream = 0
        self.max_seq = 0
        self.needs_hello = True
        self.hello_pending = False  # a legitimate HELLO went: the next WELCOME's cookie is ours
        self.got: list[bytes] = []  # payloads delivered (MSGS), kept for the final checks
        self.turn = 0  # where its legitimate traffic is in LEGIT_ORDER
        self.partition: Callable[[str], int] = lambda topic: 0  # (durable frames: the member's map)

    def seen(self, f: tuple[Any, ...]) -> None:
        """A frame the node sent us: what a real client takes from it."""
        t = f[0]
        if t is FrameType.MSGS or t is FrameType.MSGSRUN:
            self.got += [m[3] for m in f[3][:8]] if t is FrameType.MSGS else f[3][:8]
            del self.got[:-8]
        if t is FrameType.MSGS and f[1]:
            if f[1] > self.stream:
                self.stream, self.max_seq = f[1], 0
            if f[1] == self.stream and f[2] <= self.max_seq + 1:
                self.max_seq = max(self.max_seq, f[2] + len(f[3]) - 1)
        elif t is FrameType.PUBACK and f[1] == self.pid:
            self.acked = max(self.acked, f[2])
        elif t is FrameType.ERROR and f[1] == ErrorCode.BAD_COOKIE:
            self.needs_hello = True
        elif t is FrameType.WELCOME and self.hello_pending:
            self.cookie, self.hello_pending = f[2], False

    def hello(self) -> bytes:
        """A legitimate HELLO: the WELCOME it brings gives the client its cookie."""
        self.needs_hello, self.hello_pending = False, True
        return wire.encode_hello(self.cid)

    # ------------------------------------------------------------ frames

    def pub(self, legit: bool, msgs: list[tuple[str, str | None, dict[str, str] | None, bytes]],
            reliable: bool = True) -> bytes:  # fmt: skip
        packed = [wire.pack_message(*m) for m in msgs]
        if reliable:
            data = wire.encode_pub(self.cid, self.cookie, self.pid, self.seq, self.acked + 1, True, packed)
            self.seq += len(msgs) if legit else 0
        else:
            data = wire.encode_pub(self.cid, self.cookie, self.fpid, self.fseq, self.fseq, False, packed)
            self.fseq += len(msgs) if legit else 0
        return data

    def cmds(self, legit: bool, cmds: list[tuple[int, str, str | None, int]], session: int | None = None) -> bytes:
        if session is not None and legit:
            self.session, self.batch = session, 0
        data = wire.encode_cmds(self.cid, self.cookie, self.session, self.batch + 1, cmds)
        self.batch += 1 if legit else 0
        return data


def _pub_one(c: BinClient, legit: bool) -> bytes:
    return c.pub(legit, [("t", None, None, b"r%d" % c.seq)])


def _pub_run(c: BinClient, legit: bool) -> bytes:
    return c.pub(legit, [("t", None, None, b"a"), ("t", None, None, b"b"), ("t", None, None, b"c" * 300)])


def _pub_mixed(c: BinClient, legit: bool) -> bytes:
    part = {wire.PART_TAG: f"{c.pid[:4].hex()}-{c.seq:x} 0 2 1030", "a": "2"}
    return c.pub(legit, [("t", "k", {"a": "5", "kind": "x"}, b"m"), ("t.x", None, None, b"w"),
                         ("q", None, part, b"p" * 515), ("v", "k2", None, b"")])  # fmt: skip


def _pub_fire(c: BinClient, legit: bool) -> bytes:
    return c.pub(legit, [("u", None, None, b"f1"), ("u", None, None, b"f2")], reliable=False)


def _pubrun(c: BinClient, legit: bool) -> bytes:
    data = wire.encode_pubrun(c.cid, c.cookie, c.fpid, c.fseq, "u", [b"x", b"y" * 255, b""])
    c.fseq += 3 if legit else 0
    return data


def _subs(c: BinClient, legit: bool) -> bytes:
    return c.cmds(legit, [(1, "t", None, 1), (1, "u", None, 0), (1, "t", "k", 1), (1, "v", "k2", 0)])


def _filters(c: BinClient, legit: bool) -> bytes:
    return c.cmds(legit, [(1, "t.*", None, 0), (1, "q queue=g", None, 1), (1, "t where a > 1", None, 1),
                          (1, "u queue=h", None, 0), (1, "t.>", "k", 1)])  # fmt: skip


def _unsubs(c: BinClient, legit: bool) -> bytes:
    return c.cmds(legit, [(0, "t", None, 0), (0, "q queue=g", None, 1), (0, "u", None, 0)])


def _sync(c: BinClient, legit: bool) -> bytes:
    return c.cmds(legit, [(2, "-", None, 0), (1, "t", None, 1), (1, "u", None, 0)])


def _restart(c: BinClient, legit: bool) -> bytes:
    return c.cmds(legit, [(1, "t", None, 1)], session=c.session + 1)


def _ack(c: BinClient, legit: bool) -> bytes:
    return wire.encode_ack(c.cid, c.cookie, c.stream, c.max_seq, [[c.max_seq + 2, c.max_seq + 3]])


def _ping(c: BinClient, legit: bool) -> bytes:
    return wire.encode_ping(c.cid, c.cookie, c.turn, 0x5EED, c.session)


def _status(c: BinClient, legit: bool) -> bytes:
    return wire.encode_status(c.cid, c.cookie)


def _map(c: BinClient, legit: bool) -> bytes:
    return wire.encode_map_request(c.cid, c.cookie)


def _bye(c: BinClient, legit: bool) -> bytes:
    return wire.encode_bye(c.cid, c.cookie, c.session)


def _hello(c: BinClient, legit: bool) -> bytes:
    return wire.encode_hello(c.cid)


def _put(c: BinClient, legit: bool) -> bytes:
    return durablewire.encode_put(c.cid, c.cookie, c.pid, c.partition("d"), 1, 1,
                                  [wire.pack_message("d", None, {"k": "v"}, b"durable")])  # fmt: skip


def _get(c: BinClient, legit: bool) -> bytes:
    return durablewire.encode_get(c.cid, c.cookie, c.pid, "r", "d", c.partition("d"), 0, 0, 10, 0)


def _commit(c: BinClient, legit: bool) -> bytes:
    return durablewire.encode_commit(c.cid, c.cookie, c.pid, "r", "d", c.partition("d"), 1)


def _not_for_nodes(c: BinClient, legit: bool) -> bytes:
    """Frames only nodes send: a node refuses them, and a mutation may make them look like others."""
    return wire.encode_msgs(1, 1, [wire.pack_delivery("t", None, None, b"x", c.pid, 1)]) if c.turn & 1 \
        else wire.encode_puback(c.pid, 1)  # fmt: skip


Template = Callable[[BinClient, bool], bytes]
#: Every frame a client sends a node (the template a plan's ``b`` picks), and two it should not.
TEMPLATES: list[Template] = [_pub_one, _pub_run, _pub_mixed, _pub_fire, _pubrun, _subs, _filters, _unsubs, _sync,
                             _restart, _ack, _ping, _status, _map, _bye, _hello, _put, _get, _commit,
                             _not_for_nodes]  # fmt: skip
#: A client's legitimate traffic between mutated frames, in turn.
LEGIT_ORDER: list[Template] = [_subs, _pub_one, _ack, _pub_fire, _ping, _pub_run, _ack, _pubrun, _filters,
                               _pub_mixed, _ack, _status, _unsubs, _pub_one, _ack, _sync]  # fmt: skip


def legit_next(c: BinClient) -> bytes:
    """The client's next legitimate frame (a HELLO when it needs a cookie)."""
    if c.needs_hello:
        return c.hello()
    t = LEGIT_ORDER[c.turn % len(LEGIT_ORDER)]
    c.turn += 1
    return t(c, True)


TEXT_LINES = [b"SUB t\n", b"SUB u \n", b"PUB t\nhello", b"PUB u\t\tbody with  spaces ", b"UNSUB t\n",
              b"SUB t.*\n", b"SUB a.>\n", b"PUB t.x\nx", b"UNSUB u\n", b"PUB a.b.c\n"]  # fmt: skip
