"""Target (d): the client's router and sessions (client/router.py, client/session.py) fed every
frame a node sends, valid in context and then mutated, among the real answers of a broker core
they talk to: the client must not crash whatever arrives from the network.

The router's first session talks to a real broker core (a single node); a publisher of its own
there sends it messages, and the application publishes, subscribes and takes messages between
the mutated frames (``APP``). A mutated frame comes from the node's address (spoofed: UDP cannot
tell), from a member a map named, or from a stranger; its template is the last frame of that
type the node sent this client (the node's own encoders), or one built with the encoders for
the frames the node had no reason to send yet (maps in WELCOME and REDIRECT, queue marks, large
messages' parts, MSGSRUN, durable replies).

Checked after every step: nothing escapes the router or a session; everything the client sends
decodes as a frame and fits a datagram; its receive side agrees with itself (what it counts as
buffered is what its queues hold; remembered fire datagrams, holes and partial messages stay
within their bounds); the node stays consistent. At the end, through the router as an
application would (so that a route a spoofed map took elsewhere is caught), a new fire
subscription gets a fresh publisher's message, and a fire publish reaches a fresh subscriber at
the node (reliable streams, producer sequences and fire numbers a spoofed frame took are not
asked for: UDP gives the client no way to tell the node's datagrams from others',
docs/security.md). One case is withheld, an open problem: a map spoofed from the node's address
that names no address of the node takes the router's routes for good (``hijacks``).

A mutated frame counts (``mutated``) only if its bytes differ from its template's and the session
reads it: one from an address it does not know (STRANGER's; a member's until a map names it) is
dropped before its decoder.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from roost.client import clustermap, decoding, durablewire, wire
from roost.client.commands import MAX_BATCH
from roost.client.config import ClientConfig
from roost.client.receive import FIRE_WINDOW, MAX_HOLES, MAX_PRODUCERS
from roost.client.router import Router
from roost.client.session import MAX_CANDIDATES, ClientSession
from roost.client.wire import ErrorCode, FrameType, Mode, WireError
from roost.node.config import NodeConfig
from roost.node.core import BrokerCore
from tests.fuzz import checks
from tests.fuzz.clientframes import BinClient, legit_next
from tests.fuzz.mutate import AFTER, KINDS, STEPS, VALUES, Mutated, Plan, Values, mutate_packed

NODE = ("127.0.0.1", 7400)
STRANGER = ("203.0.113.5", 7400)
MEMBERS = {f"n{i}": (("127.0.0.1", 7400 + i - 1), ("127.0.0.1", 7500 + i)) for i in (1, 2, 3)}
MAP = clustermap.compute(3, MEMBERS, {"n1", "n2"}, 16, 2)
MARK = wire.mark_id("q queue=g", None)


class ClientRig:
    def __init__(self, free: list[Any]) -> None:
        self.now = 0.0
        self.core = BrokerCore(NodeConfig(mailbox_capacity=64, send_window=16), random.Random(1), 1)
        self.router = Router(b"\xc7" * 16, b"\xa7" * 16, b"\xf7" * 16, ClientConfig(), 0.0, node=NODE, session=5)
        self.addrs: dict[int, tuple[str, int]] = {}  # id(session) -> its socket's address
        self.publisher = BinClient(1, ("127.0.0.1", 5101))
        self.watcher = BinClient(2, ("127.0.0.1", 5102))  # (the final check's subscriber of the router's publish)
        self.others = {c.addr: c for c in (self.publisher, self.watcher)}
        self.heard: dict[FrameType, bytes] = {}  # the last frame of each type the node sent the first session
        self.values = Values(VALUES, free)
        self.trace: deque[str] = deque(maxlen=24)
        self.frames = self.mutated = self.steps = 0
        self.app_turn = 0
        self.subs: dict[tuple[str, str | None], Any] = {}

    @property
    def first(self) -> ClientSession:
        return self.router.first

    def _addr(self, s: ClientSession) -> tuple[str, int]:
        return self.addrs.setdefault(id(s), ("127.0.0.1", 9500 + len(self.addrs)))

    # ------------------------------------------------------------ the network

    def exchange(self, rounds: int = 4) -> None:
        """Datagrams both ways until quiet: the sessions' to the node, the node's back."""
        router, core = self.router, self.core
        for _ in range(rounds):
            moved = False
            for s in list(router.sessions):
                for dst, data in s.outgoing(self.now):
                    f = checks.decodes(data, 65507)
                    assert f is not None and f[0] in _CLIENT_SENDS, f"the client sent {f and f[0]!r}"
                    if dst == NODE:
                        moved = True
                        self._node_out(core.handle_datagrams([(data, self._addr(s))], self.now))
            if not moved:
                return

    def _node_out(self, actions: list[Any]) -> None:
        by_addr = {self._addr(s): s for s in self.router.sessions}
        for f, send in checks.broker_actions(actions, self.core.cfg.max_datagram):
            s = by_addr.get(send.addr)
            if s is not None:
                if f is not None and s is self.first:
                    self.heard[f[0]] = send.data
                self.router.handle_datagrams(s, [(send.data, NODE)], self.now)
            elif send.addr in self.others and f is not None:
                self.others[send.addr].seen(f)

    def tick(self, dt: float) -> None:
        self.now += dt
        self.trace.append(f"tick +{dt} = {self.now:.3f}")
        for s in list(self.router.sessions):
            self.router.tick(s, self.now)
        self._node_out(self.core.tick(self.now))
        self.exchange()

    def publish_to_us(self) -> None:
        """The other client's legitimate traffic: messages for our subscriptions among it."""
        self._node_out(self.core.handle_datagrams([(legit_next(self.publisher), self.publisher.addr)], self.now))

    # ------------------------------------------------------------ frames a node sends

    def template(self, which: int) -> bytes:
        s = self.first
        cookie = s.cookie or b"k" * 16
        stream = s.recv.streams.get(NODE)
        sid, seq = (stream.stream, stream.expected) if stream is not None else (65537, 1)
        inflight = s.cmds.inflight
        batch = inflight[0] if inflight is not None else s.cmds.next_batch
        params: dict[str, Any] = {"max_datagram": 16384, "ping_interval": 0.5, "runs": 1, "map_epoch": MAP.epoch,
                                  "map": clustermap.encode(MAP)}  # fmt: skip
        pid = bytes([0xA1]) * 16
        marked = wire.mark_delivery(wire.pack_delivery("q", None, None, b"g", pid, 9), [MARK])
        part = wire.pack_message("t", None, {wire.PART_TAG: f"{pid[:4].hex()}-9 0 2 600", "a": "1"}, b"p" * 300)
        made = [
            lambda: wire.encode_welcome("n1", cookie, params, [[m, *a[0]] for m, a in MEMBERS.items()]),
            lambda: wire.encode_redirect("n2", clustermap.encode(MAP)),
            lambda: wire.encode_msgs(sid, seq, [marked]),
            lambda: wire.encode_msgs(0, 3, [part]),
            lambda: wire.msgsrun_header(7) + wire.run_body("u", [b"a", b"b" * 255])[1],
            lambda: wire.encode_cancel("t", None, wire.Reason.OUT_OF_CAPACITY),
            lambda: wire.encode_error(ErrorCode.BAD_COOKIE, "send HELLO"),
            lambda: wire.encode_pong(s.ping_token, False, cookie, [["t", None, "timed_out"]], 77),
            lambda: wire.encode_cmdack(s.session, batch, [0, 14, 10]),
            lambda: wire.encode_puback(b"\xa7" * 16, s.pub.acked + 1),
            lambda: wire.encode_status_reply({"node": "n1", "metrics": {"published": 1}}),
            lambda: durablewire.encode_putack(self.router.putter.pid, 0, 1, durablewire.PUT_OK),
            lambda: durablewire.encode_records("r", 0, 0, 1, 0, [[0, 1000, "d", None, None, b"x"]], 0, 1),
            lambda: durablewire.encode_committed("r", 0, 1, 0),
        ]
        heard = list(self.heard.values())
        pick = which % (len(made) + len(heard))
        return made[pick]() if pick < len(made) else heard[pick - len(made)]

    # ------------------------------------------------------------ steps

    def step(self, plan: Plan) -> None:
        a, b, c = plan
        kind, src, after = KINDS[a & 7], (a >> 3) & 7, AFTER[a >> 6]
        data = self.template(b)
        m = mutate_packed(data, kind, b >> 5, self.values, c)
        origin = NODE if src < 5 else STRANGER if src == 7 else MEMBERS["n2"][0]
        s = self.first
        if origin == s.node and hijacks(m.data):
            m = Mutated(data, m.what + " (withheld: a map that names no address of the node)")
        self.trace.append(f"from {origin}: {data[:3].hex()} {m.what} -> {m.data[:40]!r}")
        # (counted if changed and read: a session drops a datagram from an address it does not know
        # before decoding it, as it drops STRANGER's, and a member's until a map or WELCOME names it)
        self.mutated += m.data != data and (origin == s.node or origin in s.candidates)
        self.frames += 1
        if after == "batch":
            self.router.handle_datagrams(s, [(m.data, origin), (self.template(b + 1), origin)], self.now)
        else:
            self.router.handle_datagrams(s, [(m.data, origin)], self.now)
        if after == "then-legit" or src == 4:
            self.app(b)
        self.exchange()
        if after == "tick":
            self.tick(min(STEPS[c >> 12], 1.0))  # (a node silent for node_timeout is left: not what this is about)
        if src == 3:
            self.publish_to_us()
            self.exchange()
        self._after()

    def app(self, which: int) -> None:
        """What an application does between datagrams, in turn (a call the library refuses, such as
        a message over the max_payload a node's WELCOME set, raises to the application: fine)."""
        try:
            self._app(which)
        except WireError as exc:
            self.trace.append(f"the application was refused: {exc.text[:60]}")

    def _app(self, which: int) -> None:
        r = self.router
        self.app_turn += 1
        turn = (self.app_turn + which) % 10
        if turn == 0:
            r.publish("t", None, None, b"r", True)
        elif turn == 1:
            r.publish("u", None, None, b"f", False)
        elif turn in (2, 3, 4):
            topic, mode = [("t", Mode.RELIABLE), ("q queue=g", Mode.RELIABLE), ("t.*", Mode.FIRE)][turn - 2]
            self.subs[(topic, None)] = r.subscribe(topic, None, mode)[1]
        elif turn == 5:
            for key, st in self.subs.items():
                sess = r._sub_at.get(key, r.first)
                n = len(st.queue)
                for _ in range(n):
                    st.take()
                sess.consumed(st, n)
        elif turn == 6:
            r.publish("t", "k", {"a": "2"}, b"x" * 40_000, True)  # (in parts)
        elif turn == 7 and self.subs:
            key = sorted(self.subs, key=repr)[self.app_turn % len(self.subs)]
            r.unsubscribe(*key)
            del self.subs[key]
        elif turn == 8:
            self.first.status_request()
        else:
            r.publish("t", None, {"k": "v"}, b"y", True)

    def _after(self) -> None:
        self.steps += 1
        for s in self.router.sessions:
            receiver_consistent(s)
        checks.counters_in_range(self.core.metrics)
        if self.steps % 8 == 0:
            checks.broker_consistent(self.core)

    # ------------------------------------------------------------ the end of an example

    def finish(self) -> bool:
        """Through the router, as an application uses it: a new fire subscription gets a fresh
        publisher's message, and a fire publish reaches a fresh subscriber at the node. (A spoofed
        WELCOME may have set a ping interval longer than the client's node_timeout: then it takes
        its node for silent now and then, and moves on, and back; a session the router opened for
        a member a spoofed map named fails over to the others it names. A fire MSGS spoofed with
        the number of the node's next fire datagram makes the client drop that one as a
        duplicate, as fire allows: up to four are sent, one at a time.)"""
        r = self.router
        for _ in range(8):
            self.tick(0.3)
        s, st = r.subscribe("fresh", None, Mode.FIRE)
        self.exchange()
        for _ in range(40):  # (12 s: failovers, node_timeout 1.5 s each)
            if st.confirmed:
                break
            self.tick(0.3)
        assert st.confirmed, (f"the node never confirmed a new subscription made through the router (reason "
                              f"{st.reason}, its session talks to {s.node}, events {s.events[-5:]})")  # fmt: skip
        pub, watcher = self.publisher, self.watcher
        for x in (pub, watcher):
            if x.needs_hello:
                self._node_out(self.core.handle_datagrams([(x.hello(), x.addr)], self.now))
        self._node_out(self.core.handle_datagrams([(watcher.cmds(True, [(1, "fresh.out", None, 0)]), watcher.addr)],
                                                  self.now))  # fmt: skip
        for _ in range(4):  # (one each: a spoofed MSGS may have taken the number of the node's next)
            data = pub.pub(True, [("fresh", None, None, b"hello")], reliable=False)
            self._node_out(self.core.handle_datagrams([(data, pub.addr)], self.now))
            self.exchange()
            if st.queue:
                break
        got = [x if x.__class__ is bytes else x[3] for x in st.queue]
        assert got == [b"hello"], f"a new subscription got {got}"
        for _ in range(40):  # (fire: sent once its session is connected, where a failover took it)
            ps = r.pub_session("fresh.out")
            if ps.connected:
                r.publish("fresh.out", None, None, b"out", False)
            self.exchange()
            if watcher.got:
                break
            self.tick(0.3)
        assert watcher.got[:1] == [b"out"], (f"a fire publish through the router reached a subscriber as "
                                             f"{watcher.got} (its session talks to {ps.node})")  # fmt: skip
        return True


def hijacks(data: bytes) -> bool:
    """A WELCOME or REDIRECT whose cluster map names no member at the node's address. The router
    takes a map spoofed from its node's address (this node, a single one, never sends one to set it
    right), and one that names only other addresses routes its subscriptions and publishes there
    for good: tests/test_fuzz.py's ``test_a_spoofed_redirect_with_a_higher_epoch_takes_the_routes``
    shows it, an open problem (docs/security.md, "Fuzzing"). Until it is solved the campaign does
    not send such a map (the frame's template goes in its place, fed as legitimate); every other
    mutation of a map is sent, and the final check, made through the router, catches any other
    route that no longer reaches the node."""
    try:
        f = decoding.decode_untrusted_frame(data, 65536)
    except WireError:
        return False
    cmap = f[5] if f[0] is FrameType.WELCOME else f[2] if f[0] is FrameType.REDIRECT else None
    return cmap is not None and all(client != NODE for client, _ in cmap.members.values())


_CLIENT_SENDS = {
    FrameType.HELLO,
    FrameType.CMDS,
    FrameType.PUB,
    FrameType.PUBRUN,
    FrameType.ACK,
    FrameType.PING,
    FrameType.STATUS,
    FrameType.MAP,
    FrameType.PUT,
    FrameType.GET,
    FrameType.COMMIT,
    FrameType.BYE,
}


def receiver_consistent(s: ClientSession) -> None:
    """A session's receive side agrees with itself and stays within its bounds."""
    recv = s.recv
    counted = {id(st): st for st in [*s.subs.values(), *s._leaving.values()] if st.counted}
    for st in s.subs.values():
        assert len(st.seqs) == sum(1 for x in st.queue if x.__class__ is bytes), "seqs and payloads differ"
    assert recv.buffered == sum(len(st.queue) for st in counted.values()), \
        f"buffered {recv.buffered}, queues {sum(len(st.queue) for st in counted.values())}"  # fmt: skip
    assert len(recv.fire_seen) <= FIRE_WINDOW
    assert len(recv.seen) <= MAX_PRODUCERS and len(recv.early) <= MAX_PRODUCERS
    assert len(s.candidates) <= MAX_CANDIDATES and set(s.candidates) == s._known
    assert len(s._cancels_told) <= MAX_BATCH
    assert all(len(h) <= MAX_HOLES for h in recv.holes.values())
    assert recv.parts.held <= recv.parts.max_bytes
    assert len(s.durable_replies) <= 64
    assert 0 <= s.pub.acked < s.pub.next_seq, f"acknowledged {s.pub.acked}, next {s.pub.next_seq}"
