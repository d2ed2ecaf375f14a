"""Target (a): the broker core (node/core.py) fed every binary client frame and text line, valid
in context and then mutated, from several clients, with time passing.

Four cores, one per example (``VARIANTS``): a single node; one with tight limits (admission per
host, subscriptions per client, small mailboxes and datagrams, text leases, short time-outs);
a replica (``replicating``: tombstones, the digest, Replicate actions); a member's core of a
partitioned cluster (ownership and a map: REDIRECT, MAP, Forward, Confirm, durable requests).

Checked after every frame: nothing escapes ``handle_datagrams`` or ``tick``; every Send decodes
(or is a text line) and fits ``max_datagram``; what it replicates or forwards passes the peer
decoders; the counters stay in 0..2**63-1. A datagram the node must refuse changes nothing
(``snapshot``: the index, records and text subscriptions of ``state_digest``, and every
producer's sequence and last time, every record's session, batch and liveness, every mailbox's
sequences, lengths and bytes, the published, delivered and forwarded counters) and is answered,
if at all, at its source only (no Send to another address, no Forward, Relay or Replicate). Which
datagrams must be refused is the rig's own knowledge, not the node's cookie check: a binary
datagram that does not carry a client id and cookie the node gave that address (``issued``: each
WELCOME's and PONG's cookie, with the ids of the datagrams that address sent in that batch), a
text line from outside ``text_networks``; and, as before, what the decoders refuse, HELLO and
the frames only nodes send. A STATUS, MAP or durable request with a good cookie changes nothing
either. Every 8 frames: ``checks.broker_consistent`` and STATUS. At the end: a fresh subscriber
gets a fresh publisher's message (binary, and text), then, with every client silent past its
time-outs, nothing is left held (producers, records, admission).

A mutated frame counts (``mutated``) only if its bytes differ from its template's: an ``as-is``
plan, or a mutation that gave the same bytes back, is fed as a legitimate frame.
"""

from __future__ import annotations

import ipaddress
import random
from collections import deque
from typing import Any

import msgpack

from roost.client import clustermap, decoding, wire
from roost.client.text import parse_untrusted_text
from roost.client.wire import FrameType, WireError
from roost.node.config import NodeConfig
from roost.node.core import BrokerCore, Confirm, Log, Send
from roost.node.ownership import Ownership
from tests.fuzz import checks
from tests.fuzz.clientframes import TEMPLATES, TEXT_LINES, Addr, BinClient, legit_next
from tests.fuzz.mutate import AFTER, KINDS, STEPS, VALUES, Plan, Values, mutate_packed, mutate_text

A, B, C = ("127.0.0.1", 5001), ("127.0.0.1", 5002), ("127.0.0.1", 5003)
FAR = ("198.51.100.7", 4000)  # (not on text_networks: no text, errors within 3x what it sent)
V6 = ("::1", 5004)
T1, TFAR = ("127.0.0.1", 6001), ("198.51.100.8", 6002)
WALL = 1_780_000_000.0
TWO = {"n1": (("127.0.0.1", 7401), ("127.0.0.1", 7501)), "n2": (("127.0.0.1", 7402), ("127.0.0.1", 7502))}

#: The frames that may change a node's state, given a good cookie (STATUS, MAP, PUT, GET and COMMIT
#: carry one too, and change nothing of the core's; HELLO and the node's own frames none).
_CHANGING = {FrameType.CMDS, FrameType.PUB, FrameType.PUBRUN, FrameType.ACK, FrameType.PING, FrameType.BYE}
#: The frames that, with a good cookie, change nothing of the core's but may act (StatusQuery, a REDIRECT, the
#: durable requests' actions).
_INERT = {FrameType.STATUS, FrameType.MAP, FrameType.PUT, FrameType.GET, FrameType.COMMIT}
#: Counters a refused datagram must leave as they are (``snapshot``).
_COUNTED = ("published", "delivered", "forwarded_out", "pub_duplicates", "retransmitted", "streams_restarted")
VARIANTS = ("single", "tight", "replica", "partitioned")
TIGHT = {"mailbox_capacity": 16, "send_window": 8, "max_datagram": 1500, "max_payload": 1500, "max_per_host": 3,
         "max_clients": 12, "max_producers": 12, "max_subscriptions_per_client": 5, "max_text_subscribers": 3,
         "text_sub_lease": 2.0, "subscriber_timeout": 3.0, "producer_timeout": 5.0, "retransmit_timeout": 0.05,
         "retransmit_max": 0.4, "ping_interval": 0.5}  # fmt: skip


def snapshot(core: BrokerCore, liveness: bool) -> tuple[Any, ...]:
    """What a datagram the node must refuse may not change: ``state_digest`` (index, records,
    producer ids, text subscriptions), every producer's sequence, last time and host, every
    record's session, batch and mailbox (sequences, length, bytes, SACKs), a few counters; and
    with ``liveness`` when each record last heard from its client (a STATUS, MAP or durable
    request with a good cookie is news of the client, and changes nothing else)."""

    def mailbox(mb: Any) -> Any:
        if mb is None:
            return None
        return mb.stream_id, mb.acked, mb.sent, len(mb), mb.nbytes, mb.inflight, sorted(mb.sacked)

    records = sorted((repr(cid), c.session, c.last_batch, mailbox(c.mailbox), mailbox(c.parked and c.parked[0]),
                      (c.last_seen, c.heard) if liveness else None) for cid, c in core.clients.items())  # fmt: skip
    producers = sorted((pid, *st.fields()) for pid, st in core.producers.items())
    return core.state_digest(), producers, records, [core.metrics[k] for k in _COUNTED]


def ids(data: bytes) -> tuple[Any, Any]:
    """The client id and cookie fields of a binary datagram (``[version, type, id, cookie,
    ...]``), read as leniently as msgpack can (a string as bytes, any map key, tuples), so that
    whatever the node's stricter decoder takes is read here too; (None, None) if it is no array."""
    try:
        f = msgpack.unpackb(data, raw=True, strict_map_key=False)
    except Exception:
        return None, None
    if f.__class__ is not list or len(f) < 3:
        return None, None
    return f[2], f[3] if len(f) > 3 else None


def make_core(variant: str) -> BrokerCore:
    if variant == "single":
        return BrokerCore(NodeConfig(mailbox_capacity=64, send_window=16), random.Random(1), 1)
    if variant == "lax":  # (a broken build: a frame with a wrong cookie is taken; tests/test_fuzz.py)
        cfg = NodeConfig(mailbox_capacity=64, send_window=16, breaks=frozenset({"accept-any-cookie"}))
        return BrokerCore(cfg, random.Random(1), 1)
    if variant == "tight":
        return BrokerCore(NodeConfig(**TIGHT), random.Random(1), 1)
    core = BrokerCore(NodeConfig(id="n1", client_addr=TWO["n1"][0]), random.Random(1), 1,
                      members=[[m, *a[0]] for m, a in TWO.items()], node_idx=0, wall_offset=WALL,
                      replicating=True, tombstone_horizon=30.0)  # fmt: skip
    if variant == "partitioned":
        own = Ownership("n1", 16)
        core.set_ownership(own)
        cmap = clustermap.compute(1, TWO, set(TWO), 16, 1)
        core.reindex(*own.update(1, cmap.owners))
        core.set_cluster_map(clustermap.encode(cmap), 1)
    return core


def _changed(before: tuple[Any, ...], after: tuple[Any, ...]) -> str:
    names = ("state_digest", "producers", "records and mailboxes", f"counters {_COUNTED}")
    return "; ".join(f"{n}: {str(b)[:300]} -> {str(a)[:300]}" for n, b, a in zip(names, before, after, strict=True)
                     if a != b)  # fmt: skip


class NodeRig:
    """One example: a core, its clients, and the trace of what was fed."""

    def __init__(self, variant: str, free: list[Any]) -> None:
        self.variant = variant
        self.core = core = make_core(variant)
        self.now = 0.0
        self.clients = [BinClient(i, a) for i, a in enumerate((A, B, FAR, V6, C))]
        own = core.own
        for c in self.clients:
            c.partition = (lambda t: own.partition(t)) if own is not None else (lambda t: 0)
        self.by_addr = {c.addr: c for c in self.clients}
        a, b, far, v6, c3 = self.clients
        self.sources: list[BinClient | Addr] = [a, b, far, v6, c3, a, T1, TFAR]
        self.text_turn = 0
        ids = [x for cl in self.clients for x in (cl.cid, cl.pid, cl.fpid)]
        self.values = Values(VALUES, ids, free)
        self.trace: deque[str] = deque(maxlen=24)
        self.frames = self.mutated = self.steps = 0
        #: (client id, cookie) pairs the node gave each address: what a datagram from there must
        #: carry for the node to act on it (a superset: every id sent from there in that batch).
        self.issued: dict[Addr, set[tuple[bytes, bytes]]] = {}
        self.text_nets = [ipaddress.ip_network(n) for n in core.cfg.text_networks]

    # ------------------------------------------------------------ feeding

    def step(self, plan: Plan) -> None:
        a, b, c = plan
        kind, src, after = KINDS[a & 7], self.sources[(a >> 3) & 7], AFTER[a >> 6]
        if isinstance(src, BinClient):
            self._hello_if_needed(src)
            tmpl = TEMPLATES[b % len(TEMPLATES)]
            data = tmpl(src, False)
            m = mutate_packed(data, kind, b // len(TEMPLATES), self.values, c)
            addr, name = src.addr, tmpl.__name__
        else:
            data = TEXT_LINES[b % len(TEXT_LINES)]
            m = mutate_text(data, kind, b // len(TEXT_LINES), self.values, c)
            addr, name = src, data[:12].decode()
        self.trace.append(f"{addr[0]}:{addr[1]} {name}: {m.what} -> {m.data[:48]!r}")
        batch = [(m.data, addr)]
        if after == "batch":
            batch += [(self._legit(src), addr), (self._legit(src), addr)]
        self.mutated += m.data != data  # (handle_datagrams takes every one)
        self._feed(batch)
        if after == "then-legit":
            self._feed([(self._legit(src), addr)])
        elif after == "tick":
            self.tick(STEPS[c >> 12])

    def _legit(self, src: BinClient | Addr) -> bytes:
        if isinstance(src, BinClient):
            return legit_next(src)
        self.text_turn += 1
        return TEXT_LINES[self.text_turn % len(TEXT_LINES)]

    def _hello_if_needed(self, c: BinClient) -> None:
        if c.needs_hello:
            self._feed([(c.hello(), c.addr)])

    def tick(self, dt: float) -> None:
        self.now += dt
        self.trace.append(f"tick +{dt} = {self.now:.3f}")
        self._route(self.core.tick(self.now))
        self._after()

    def _feed(self, batch: list[tuple[bytes, Addr]]) -> list[tuple[Any, Send]]:
        core = self.core
        inert, refused, validated = False, False, True  # (a batch: what its datagrams do is not told apart)
        if len(batch) == 1:
            inert, refused, validated = self._judge(*batch[0])
        before = snapshot(core, refused) if inert else None
        actions = core.handle_datagrams(batch, self.now)
        out = self._route(actions)
        self.frames += len(batch)
        self._issued(batch, out)
        if before is not None:
            after = snapshot(core, refused)
            assert after == before, "a datagram the node must refuse changed its state: " + _changed(before, after)
        if refused:
            src, answers = batch[0][1], (Send, Confirm)
            bad = [a for a in actions if a.__class__ is not Log and (a.__class__ not in answers or a.addr != src)]
            assert not bad, f"a datagram the node must refuse made it act beyond answering its source: {bad[:3]}"
        if not validated and not self._text_net(batch[0][1]):  # (docs/protocol.md, amplification)
            sent = sum(len(s.data) for _, s in out if s.addr == batch[0][1])
            assert sent <= 3 * len(batch[0][0]), f"{sent} bytes to an unvalidated address that sent {len(batch[0][0])}"
        self._after()
        return out

    def _issued(self, batch: list[tuple[bytes, Addr]], out: list[tuple[Any, Send]]) -> None:
        """Note the cookies the node gave (WELCOME, PONG) with the ids their address sent."""
        for f, s in out:
            if f is not None and (f[0] is FrameType.WELCOME or f[0] is FrameType.PONG):
                cookie = f[2] if f[0] is FrameType.WELCOME else f[3]
                pairs = self.issued.setdefault(s.addr, set())
                for data, a in batch:
                    cid = ids(data)[0] if a == s.addr else None
                    if cid.__class__ is bytes:
                        pairs.add((cid, cookie))

    def _text_net(self, addr: Addr) -> bool:
        """``addr`` is on the node's text_networks (as the config says, not as the node judges)."""
        ip = ipaddress.ip_address(addr[0])
        return any(ip in n for n in self.text_nets)

    def _route(self, actions: list[Any]) -> list[tuple[Any, Send]]:
        sent = checks.broker_actions(actions, self.core.cfg.max_datagram)
        for f, s in sent:
            c = self.by_addr.get(s.addr)
            if f is not None and c is not None:
                c.seen(f)
        return sent

    def _after(self) -> None:
        self.steps += 1
        checks.counters_in_range(self.core.metrics)
        if self.steps % 8 == 0:
            checks.broker_consistent(self.core)
            checks.status_encodes(self.core.status())

    def _judge(self, data: bytes, addr: Addr) -> tuple[bool, bool, bool]:
        """(must it change nothing, must it be refused, does it carry a cookie the node gave its
        address) by what the rig knows: the cookies the node gave (``issued``), the text
        networks of its config; and by the decoders, whose refusals the node must follow. What a
        datagram the node takes changes is tested in test_core.py; a refused one must change
        nothing and answer its source only, and an address without a cookie gets at most 3 times
        what it sent."""
        core = self.core
        if data[:1].isalpha():
            if not self._text_net(addr):
                return True, True, False
            try:
                verb, topic, _ = parse_untrusted_text(data)
                (wire.check_topic if verb == "PUB" else wire.check_filter)(topic)
            except WireError:
                return True, True, False
            return False, False, False
        cid, cookie = ids(data)
        valid = cid.__class__ is bytes and cookie.__class__ is bytes and (cid, cookie) in self.issued.get(addr, ())
        if not valid or len(data) > core.cfg.max_datagram:
            return True, True, valid
        try:
            f = decoding.decode_untrusted_frame(data, core.cfg.max_datagram)
        except WireError:
            return True, True, valid
        return f[0] not in _CHANGING, f[0] not in _CHANGING and f[0] not in _INERT, valid

    # ------------------------------------------------------------ the end of an example

    def finish(self) -> bool:
        """The final checks; True (the legitimate clients were served)."""
        core = self.core
        checks.broker_consistent(core)
        checks.status_encodes(core.status())
        self.now += 1.0
        self.trace.append("legitimate clients")
        topic = "fresh"
        if core.own is not None:
            cmap = clustermap.compute(1, TWO, set(TWO), 16, 1)
            topic = next(f"fresh{i}" for i in range(100) if cmap.primary(f"fresh{i}") == "n1")
        sub, pub = BinClient(8, ("127.0.0.9", 7001)), BinClient(9, ("127.0.0.9", 7002))
        self.by_addr.update({sub.addr: sub, pub.addr: pub})
        for x in (sub, pub):
            self._hello_if_needed(x)
            assert x.cookie != b"\x00" * 16, "no WELCOME for a fresh client"
        acks = self._feed([(wire.encode_cmds(sub.cid, sub.cookie, 1, 1, [(1, topic, None, 1)]), sub.addr)])
        assert any(f is not None and f[0] is FrameType.CMDACK and f[3] == [0] for f, _ in acks), f"SUB refused: {acks}"
        out = self._feed([(wire.encode_pub(pub.cid, pub.cookie, pub.pid, 1, 1, True,
                                           [wire.pack_message(topic, None, None, b"hello")]), pub.addr)])  # fmt: skip
        assert sub.got == [b"hello"], f"the fresh subscriber got {sub.got}"
        assert any(f is not None and f[0] is FrameType.PUBACK and f[2] == 1 for f, s in out if s.addr == pub.addr)
        if core.own is None and core.text_subs < core.cfg.max_text_subscribers:
            self._feed([(f"SUB {topic}\n".encode(), ("127.0.0.9", 7003))])
            out = self._feed([(f"PUB {topic}\nline".encode(), ("127.0.0.9", 7004))])
            assert [s.data for _, s in out if s.addr == ("127.0.0.9", 7003)] == [f"MSG {topic}\nline".encode()]
        self._quiesce()
        return True

    def _quiesce(self) -> None:
        """Every binary client silent past its time-outs: nothing of theirs may be left."""
        core = self.core
        for dt in (10_000.0, 1_000.0):  # (a replica keeps the tombstones of the drop for its horizon)
            self.tick(dt)
            if core.replicating:
                self._route(core.collect_tombstones(self.now))
        checks.broker_consistent(core)
        assert not core.producers, f"producers left after their time-out: {len(core.producers)}"
        held = [c.cid for c in core.clients.values() if c.cid.__class__ is bytes and (c.live or c.local)]
        assert not held, f"binary clients left after their time-out: {held}"
        assert not core.admission.per_host, f"admission counts left: {dict(core.admission.per_host)}"
