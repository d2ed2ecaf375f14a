"""Helpers to drive a BrokerCore directly: fake time, no sockets."""

from __future__ import annotations

import random
from typing import Any

from roost.client import decoding, wire
from roost.client.wire import FrameType
from roost.node.config import NodeConfig
from roost.node.core import BrokerCore, Replicate, Send

NODE = ("127.0.0.1", 7400)


def make_core(**overrides: Any) -> BrokerCore:
    return BrokerCore(NodeConfig(**overrides), random.Random(1), incarnation=1)


def replicated(actions: list[Any]) -> list[list[Any]]:
    """The entries of every Replicate action."""
    return [e for a in actions if isinstance(a, Replicate) for e in a.entries]


def sends(actions: list[Any]) -> list[Send]:
    return [a for a in actions if isinstance(a, Send)]


def frames_to(actions: list[Any], addr: Any) -> list[tuple[Any, ...]]:
    """Decoded binary frames sent to ``addr``."""
    return [decoding.decode_untrusted_frame(s.data) for s in sends(actions) if s.addr == addr]


class FakeClient:
    """A binary client speaking to a core by hand, for precise protocol tests."""

    def __init__(self, core: BrokerCore, addr: tuple[str, int], cid: bytes | None = None) -> None:
        self.core = core
        self.addr = addr
        self.cid = cid or bytes([len(addr[0]) + addr[1] % 251]) * 16
        self.cookie = b""
        self.session = 1  # a client process; a restarted one uses a greater session
        self.batch = 0  # the last batch sent in this session
        self.pid = self.cid[::-1]
        self.seq = 1
        self.pushes: list[list[Any]] = []  # Replicate entries the core emitted for us

    def send(self, data: bytes, now: float) -> list[Any]:
        actions = self.core.handle_datagrams([(data, self.addr)], now)
        self.pushes += replicated(actions)
        return actions

    def take_pushes(self) -> list[list[Any]]:
        out, self.pushes = self.pushes, []
        return out

    def hello(self, now: float = 0.0) -> None:
        (f,) = frames_to(self.send(wire.encode_hello(self.cid), now), self.addr)
        assert f[0] is FrameType.WELCOME
        self.cookie = f[2]

    def cmds(self, cmds: list[tuple[int, str, str | None, int]], now: float = 0.0) -> list[Any]:
        """The next batch of this session."""
        self.batch += 1
        return self.send(self.cmds_frame(self.batch, cmds), now)

    def cmds_frame(self, batch: int, cmds: list[tuple[int, str, str | None, int]], session: int | None = None) -> bytes:
        """A CMDS frame of this client (of its current session unless told)."""
        return wire.encode_cmds(self.cid, self.cookie, self.session if session is None else session, batch, cmds)

    def restart(self) -> None:
        """The same client id from a new process: a greater session, batches from 1."""
        self.session += 1
        self.batch = 0

    def sub(self, topic: str, key: str | None = None, mode: int = 1, now: float = 0.0) -> list[Any]:
        return self.cmds([(1, topic, key, mode)], now)

    def pub(self, msgs: list[tuple[str, bytes]], now: float = 0.0, reliable: bool = True) -> list[Any]:
        packed = [wire.pack_message(t, None, None, p) for t, p in msgs]
        data = wire.encode_pub(self.cid, self.cookie, self.pid, self.seq, self.seq, reliable, packed)
        self.seq += len(msgs)
        return self.send(data, now)

    def ack(self, stream: int, max_seq: int, sack: list[list[int]] | None = None, now: float = 0.0) -> list[Any]:
        return self.send(wire.encode_ack(self.cid, self.cookie, stream, max_seq, sack or []), now)

    def ping(self, now: float, token: int = 1) -> list[Any]:
        return self.send(wire.encode_ping(self.cid, self.cookie, token, 0, self.session), now)


def connect(core: BrokerCore, *addrs: tuple[str, int]) -> list[FakeClient]:
    """FakeClients at ``addrs`` that already hold a cookie."""
    clients = [FakeClient(core, a) for a in addrs]
    for c in clients:
        c.hello()
    return clients


def delivered(actions: list[Any], addr: Any) -> list[tuple[int, int, bytes]]:
    """(stream, seq, payload) of every message in MSGS frames to ``addr``."""
    out = []
    for f in frames_to(actions, addr):
        if f[0] is FrameType.MSGS:
            stream, first, msgs = f[1], f[2], f[3]
            for i, m in enumerate(msgs):
                out.append((stream, first + i if stream else 0, m[3]))
    return out


def random_datagram(rng: random.Random, valid: list[bytes], max_len: int, max_flips: int,
                    random_share: float = 1 / 3) -> bytes:  # fmt: skip
    """Garbage for fuzzing: random bytes (``random_share`` of the time) or one of
    the ``valid`` datagrams with 1 to ``max_flips`` bytes overwritten."""
    if rng.random() < random_share:
        return rng.randbytes(rng.randint(0, max_len))
    d = bytearray(rng.choice(valid))
    for _ in range(rng.randint(1, max_flips)):
        d[rng.randrange(len(d))] = rng.getrandbits(8)
    return bytes(d)


#: A text SUB's body, which the node ignores: padding that buys a text subscriber the credit for
#: what a test sends it (it is sent at most ``text_amplification`` times the bytes it sent).
PAD = b"." * 8000
