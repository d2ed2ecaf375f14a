"""Target (b): a cluster member's core (cluster/member.py), replicated or partitioned with durable
logs, fed peer frames after a valid handshake and client datagrams, with time passing.

The member is m0 of a cluster the simulator (sim/simulation.py) brought up to ready, copied for each
example (a run costs 10-20 ms; the copy 1 ms). Its two peers, m1 and m2, are played here over
the member's own links (``Peer``): every handshake (cluster/peerwire.py) is done for real with the
cluster secret, in both directions, and done again whenever the member closes a link; the
member's requests are answered as a peer would (PUSHACK, BEAT, DUMPEND, DIFFEND, FWDACK), and
each peer heartbeats. Disk work goes to the simulator's log disk (sim/logs.py, which
checks that appends follow each other) and snapshots are written at once.

A plan's source picks a peer's side: its requests on the link it dialled (PUSH, HEARTBEAT, PULL,
DIGEST, FORWARD, RELAY, ROSTER, LOGFETCH), its replies on the member's link (PUSHACK, FWDACK,
DIFF, DIFFEND, DUMP, DUMPEND, BEAT, LOGDATA), a handshake, or a client. A handshake step mutates
one of the frames a member reads before a peer has authenticated: the HELLO of a link the peer
dials, or its AUTH; or, on a link the member dials (the rig closes the peer's link, and the member
dials it again), the peer's CHALLENGE or a REFUSED in its place.

A mutated frame counts (``mutated``) only if its bytes differ from its template's and the member
read it (the link was still there); an ``as-is`` plan is fed as a legitimate frame.

Checked after every event: nothing escapes ``handle``; the member neither exits nor logs
``peer_error`` (an exception that its last-resort handler caught) nor ``cannot_run``; every
peer frame it writes decodes as one frame, every datagram it sends decodes (but those a
peer's RELAY carried); the broker's counters stay in range. Every 8 steps: the broker core's
consistency and the member's STATUS. At the end, if the member still serves (an authenticated
peer may tell it that it left: the roster is replicated state), a fresh subscriber gets a fresh
publisher's message from it.
"""

from __future__ import annotations

import copy
import struct
from collections import deque
from typing import Any

from roost.client import wire
from roost.cluster.events import (
    Accepted,
    Close,
    Datagrams,
    Dial,
    Exit,
    LinkBytes,
    LinkClosed,
    LinkOpened,
    Log,
    PersistDone,
    ReadSnapshot,
    Send,
    SendFrame,
    SnapshotRead,
    Tick,
    WriteSnapshot,
)  # fmt: skip
from roost.cluster.member import MemberCore
from roost.cluster.peerwire import PROTOCOL, FrameDecoder, PeerType, encode, mac
from roost.node import versions
from roost.node.logs import event_line
from sim.logs import SimLogDisk
from sim.simulation import LOG_ACTIONS, Simulation
from sim.world import WALL
from tests.fuzz import checks
from tests.fuzz.clientframes import TEMPLATES, BinClient, legit_next
from tests.fuzz.mutate import AFTER, KINDS, STEPS, VALUES, Plan, Values, mutate_packed

MODES = ("replicated", "partitioned")
_READY: dict[str, tuple[MemberCore, SimLogDisk, float]] = {}
_LEN = struct.Struct(">I")
#: Events one step may cause (the member's answers to our answers...): more is a storm.
MAX_EVENTS = 5000


def ready_member(mode: str) -> tuple[MemberCore, SimLogDisk, float]:
    """m0 of a 3-member cluster the simulator brought up, ready (a fresh copy each call)."""
    if mode not in _READY:
        sim = Simulation(1, members=3, clients=2, faults=(), fault_time=1.0, quiet=1.0, mode=mode)
        assert sim.run_until(3.0)
        core = sim.members["m0"].core
        assert core is not None and core.phase == "ready"
        for obj in (core, core.broker):  # (the simulator's accounting hooks: the class's methods again)
            for name in [k for k, v in vars(obj).items() if callable(v) and hasattr(type(obj), k)]:
                delattr(obj, name)
        _READY[mode] = copy.deepcopy((core, sim.logdisk, sim.now))
    return copy.deepcopy(_READY[mode])


def unpack_peer(data: bytes) -> Any:
    dec = FrameDecoder(1 << 30)
    dec.feed(data)
    return dec.next_frame_untrusted()


def _kind(data: bytes) -> Any:
    try:
        f = unpack_peer(data)
    except Exception:
        return None
    return f[0] if f else None


class Peer:
    """A peer played by the rig: its links into and from the member and what it last saw."""

    def __init__(self, pid: str, n: int) -> None:
        self.id = pid
        self.n = n
        self.inbound: int | None = None  # the link it dialled (the member's id for it: negative)
        self.outbound: int | None = None  # the link the member dialled to it
        self.push_seq = 0  # its PUSHes
        self.fwd = 0  # its FORWARD ids
        self.seq = 0  # its forwarded reliable messages
        self.heard_push = 0  # the member's last PUSH, FORWARD, LOGFETCH and LOGDATA to it
        self.heard_fwd = 0
        self.fetch: list[Any] | None = None
        self.data: list[Any] | None = None


class MemberRig:
    def __init__(self, mode: str, free: list[Any]) -> None:
        self.core, self.disk, self.now = ready_member(mode)
        core = self.core
        self.secret = core.secret
        self.peers = {p: Peer(p, i + 1) for i, p in enumerate(("m1", "m2"))}
        for link in core.links.values():  # (the simulator's links: taken over)
            p = self.peers.get(link.peer or "")
            if p is not None and link.up:
                if link.outbound:
                    p.outbound = link.id
                else:
                    p.inbound = link.id
        self.handshakes: dict[int, tuple[Peer, bytes]] = {}  # link -> (peer, our nonce)
        self.challenges: dict[int, list[Any]] = {}  # links whose CHALLENGE the step answers itself
        self.manual = False
        self.dialled: Peer | None = None  # the peer whose CHALLENGE the step sends itself
        self.hellos: dict[int, list[Any]] = {}  # the member's HELLOs on the links it dialled to it
        self.hello_fed = False  # dial_in fed its HELLO to a link the member had
        self.clients = [BinClient(i, ("127.0.0.2", 9100 + i)) for i in range(3)]
        for c in self.clients:
            c.partition = core.own.partition
        self.by_addr = {c.addr: c for c in self.clients}
        self.values = Values(VALUES, [x for c in self.clients for x in (c.cid, c.pid)], free)
        self.pending: deque[Any] = deque()
        self.next_link = -100
        self.relaying = False
        self.trace: deque[str] = deque(maxlen=24)
        self.frames = self.mutated = self.steps = 0

    # ------------------------------------------------------------ driving the member

    def feed(self, ev: Any) -> None:
        self.pending.append(ev)
        n = 0
        while self.pending:
            n += 1
            assert n < MAX_EVENTS, "a storm: one step caused more than 5000 events"
            self._route(self.core.handle(self.pending.popleft(), self.now))

    def _route(self, actions: list[Any]) -> None:
        core = self.core
        for a in actions:
            cls = a.__class__
            if cls is SendFrame:
                self._frame_out(a.link, a.data)
            elif cls is Send:
                f = None if self.relaying else checks.decodes(a.data, core.cfg.max_datagram)
                c = self.by_addr.get(a.addr)
                if f is not None and c is not None:
                    c.seen(f)
            elif cls is Log:
                assert a.event not in ("peer_error", "cannot_run"), f"the member logged {a.event}: {a.fields}"
                event_line(a.event, a.fields)
            elif cls is Dial:
                p = self.peers.get(a.peer)
                if p is None:
                    self.pending.append(LinkClosed(a.link, "refused"))
                else:
                    self.handshakes[a.link] = (p, b"")
                    self.pending.append(LinkOpened(a.link))
            elif cls is Close:
                self._gone(a.link)
            elif cls is Exit:
                raise AssertionError(f"the member exited: {a.error}")
            elif cls in LOG_ACTIONS:
                self.pending.append(self.disk.perform(core.id, a, self.now)[1])
            elif cls is WriteSnapshot:
                self.pending.append(PersistDone(a.token, None))
            elif cls is ReadSnapshot:
                self.pending.append(SnapshotRead(None, "missing"))

    def _gone(self, lid: int) -> None:
        self.handshakes.pop(lid, None)
        for p in self.peers.values():
            if p.inbound == lid:
                p.inbound = None
            if p.outbound == lid:
                p.outbound = None

    def _frame_out(self, lid: int, data: bytes) -> None:
        """A frame the member wrote: one whole frame; answered where a peer would answer."""
        (n,) = _LEN.unpack_from(data)
        assert n == len(data) - 4 and n <= self.core.s.max_frame, f"a peer frame of {n} bytes in {len(data)}"
        f = unpack_peer(data)
        assert f is not None
        hs = self.handshakes.get(lid)
        if hs is not None:
            self._handshake(lid, hs, f)
            return
        p = next((x for x in self.peers.values() if lid in (x.inbound, x.outbound)), None)
        if p is None or lid != p.outbound:
            if p is not None and f[0] == PeerType.LOGDATA:
                p.data = f
            return
        kind = f[0]  # the member's requests to p: answered as p would
        if kind == PeerType.PUSH:
            p.heard_push = f[1]
            self._bytes(lid, encode([PeerType.PUSHACK, f[1]]))
        elif kind == PeerType.HEARTBEAT:
            self._bytes(lid, encode([PeerType.BEAT]))
        elif kind == PeerType.PULL:
            self._bytes(lid, encode([PeerType.DUMPEND, 0]))
        elif kind == PeerType.DIGEST:
            self._bytes(lid, encode([PeerType.DIFFEND, []]))
        elif kind == PeerType.FORWARD and f[1]:
            p.heard_fwd = f[1]
            self._bytes(lid, encode([PeerType.FWDACK, f[1], []]))
        elif kind == PeerType.LOGFETCH:
            p.fetch = f

    def _handshake(self, lid: int, hs: tuple[Peer, bytes], f: list[Any]) -> None:
        p, ours = hs
        core = self.core
        if f[0] == PeerType.HELLO and p is self.dialled:
            self.hellos[lid] = f
        elif f[0] == PeerType.HELLO:  # the member dialled p: p challenges it
            nonce = bytes([0x40 + p.n]) * 16
            proof = mac(self.secret, b"L", f[3], nonce, p.id, core.id)
            self._bytes(lid, encode([PeerType.CHALLENGE, p.id, nonce, proof, core.shape]))  # fmt: skip
            self.handshakes[lid] = (p, nonce)
        elif f[0] == PeerType.AUTH:
            del self.handshakes[lid]
            p.outbound = lid
        elif f[0] == PeerType.CHALLENGE and self.manual:
            self.challenges[lid] = f
        elif f[0] == PeerType.CHALLENGE:  # p dialled the member: p authenticates
            del self.handshakes[lid]
            self._bytes(lid, encode([PeerType.AUTH, mac(self.secret, b"D", f[2], ours, p.id, core.id)]))
            if lid in core.links and core.links[lid].up:
                p.inbound = lid

    def _bytes(self, lid: int, data: bytes) -> None:
        self.pending.append(LinkBytes(lid, data))

    def dial_in(self, p: Peer, hello: bytes | None = None) -> int:
        """p dials the member: a new link and its handshake (``hello`` in place of p's HELLO)."""
        lid = self.next_link
        self.next_link -= 1
        nonce = bytes([0x20 + p.n]) * 16
        self.handshakes[lid] = (p, nonce)
        self.feed(Accepted(lid, f"127.0.0.1:{40000 - lid}"))
        self.hello_fed = lid in self.core.links
        self.feed(LinkBytes(lid, hello or encode([PeerType.HELLO, PROTOCOL, p.id, nonce, self.core.shape])))
        return lid

    def tick(self, dt: float) -> None:
        self.now += dt
        self.trace.append(f"tick +{dt} = {self.now:.3f}")
        self.feed(Tick())
        for p in self.peers.values():  # (each peer is alive and says so)
            if p.inbound is None and self.core.phase in ("syncing", "ready"):
                self.dial_in(p)
            if p.inbound is not None:
                self.feed(LinkBytes(p.inbound, self._request(p, 1, True)))
        self._after()

    def _after(self) -> None:
        self.steps += 1
        broker = self.core.broker
        checks.counters_in_range(broker.metrics)
        if self.steps % 8 == 0:
            checks.broker_consistent(broker)
            checks.status_encodes({**broker.status(), **self.core.status()})

    # ------------------------------------------------------------ frames

    def _entry(self, p: Peer, n: int, present: bool = True) -> list[Any]:
        """A register of a client of p's, written now (as p's broker core writes them)."""
        hlc = (int((self.now + WALL) * 1000) - versions.EPOCH_MS) << 12 | (n & 0xFFF)
        idx = self.core.roster.index_of(p.id)
        cid = bytes([0xE0 + p.n]) * 15 + bytes([n & 0xFF])
        return [cid, versions.make(hlc, idx, True, 0), "127.0.0.3", 9000 + (n & 0xFF), p.id,
                [["t", None, versions.make(hlc, idx, present, 1)], ["u.*", "k", versions.make(hlc, idx, True, 0)]],
                1]  # fmt: skip

    def _request(self, p: Peer, which: int, legit: bool) -> bytes:
        """p's request to the member (on the link p dialled), valid in context."""
        core = self.core
        which %= 8
        if which == 0:
            p.push_seq += 1 if legit else 0
            return encode(
                [PeerType.PUSH, p.push_seq + (0 if legit else 1), [self._entry(p, p.push_seq, which & 1 == 0)]]
            )
        if which == 1:
            digest = core.roster.digest()
            return encode([PeerType.HEARTBEAT, "ready", core.broker.index.count, 2, core.own.epoch, digest, digest])
        if which == 2:
            owned = [i for i, mine in enumerate(core.own.owned) if mine]
            return encode([PeerType.PULL, owned] if core.partitioned else [PeerType.PULL])
        if which == 3:
            digest = list(core.broker.digest)
            digest[0] ^= 1
            return encode([PeerType.DIGEST, digest])
        if which == 4:
            p.fwd += 1 if legit else 0
            p.seq += 1 if legit else 0
            return encode([PeerType.FORWARD, p.fwd + 1, [["t", None, None, b"fwd", bytes([0xB0 + p.n]) * 16, p.seq + 1],
                                                  ["u", "k", {"a": "1"}, b"fire", None, None]]])  # fmt: skip
        if which == 5:
            return encode([PeerType.RELAY, [["127.0.0.2", 9100, b"MSG t\nrelayed"], ["127.0.0.1", 6001, b"MSG t\nx"]]])
        if which == 6:
            return encode([PeerType.ROSTER, core.roster.encode()])
        plog = min(core.plogs) if core.plogs else 0
        log = core.plogs.get(plog)
        end = log.end if log is not None else 0
        return encode([PeerType.LOGFETCH, plog, log.seen if log is not None else 0, end, 0, False])

    def _reply(self, p: Peer, which: int) -> bytes:
        """p's answer to the member (on the link the member dialled), valid in context."""
        which %= 8
        if which == 0:
            return encode([PeerType.PUSHACK, p.heard_push])
        if which == 1:
            return encode([PeerType.FWDACK, p.heard_fwd, []])
        if which == 2:
            return encode([PeerType.DIFF, [self._entry(p, 7000 + p.push_seq)]])
        if which == 3:
            return encode([PeerType.DIFFEND, [0, 1]])
        if which == 4:
            return encode([PeerType.DUMP, [self._entry(p, 8000)]])
        if which == 5:
            return encode([PeerType.DUMPEND, 0])
        if which == 6:
            return encode([PeerType.BEAT])
        fetch = p.fetch or [PeerType.LOGFETCH, 0, 0, 0, 0, False]
        recs = p.data[10] if p.data is not None and p.data[1] == fetch[1] else []
        return encode([PeerType.LOGDATA, fetch[1], fetch[2], 0, 0, fetch[3] + len(recs), fetch[4], fetch[3], -1, -1,
                       [[fetch[3] + i, r[1], r[2]] for i, r in enumerate(recs)], fetch[3]])  # fmt: skip

    # ------------------------------------------------------------ steps

    def step(self, plan: Plan) -> None:
        a, b, c = plan
        kind, src, after = KINDS[a & 7], (a >> 3) & 7, AFTER[a >> 6]
        core = self.core
        if src >= 6:  # a client
            cl = self.clients[src - 6 + (b & 1)]
            if cl.needs_hello:
                self.feed(Datagrams([(cl.hello(), cl.addr)]))
            tmpl = TEMPLATES[(b >> 1) % len(TEMPLATES)]
            data = tmpl(cl, False)
            m = mutate_packed(data, kind, b >> 6, self.values, c)
            self.trace.append(f"client {cl.n} {tmpl.__name__}: {m.what} -> {m.data[:40]!r}")
            batch = [(m.data, cl.addr)]
            if after == "batch":
                batch.append((legit_next(cl), cl.addr))
            self.mutated += m.data != data  # (Datagrams: the member's broker core takes every one)
            self.frames += len(batch)
            self.feed(Datagrams(batch))
            if after == "then-legit":
                self.feed(Datagrams([(legit_next(cl), cl.addr)]))
        else:
            p = self.peers["m1" if src < 3 else "m2"]
            if src % 3 == 2 or core.phase not in ("syncing", "ready"):
                self._handshake_step(p, kind, b, c)
            else:
                self._peer_step(p, src % 3 == 0, kind, b, c, after)
        self._after()
        if after == "tick":
            self.tick(STEPS[c >> 12])

    def _peer_step(self, p: Peer, request: bool, kind: str, b: int, c: int, after: str) -> None:
        if request:
            if p.inbound is None:
                self.dial_in(p)
            lid, data = p.inbound, self._request(p, b, False)
        else:
            if p.outbound is None:
                self.tick(self.core.s.reconnect_interval)  # (the member dials p again)
            lid, data = p.outbound, self._reply(p, b)
        if lid is None:
            return
        m = mutate_packed(data, kind, b >> 3, self.values, c, unpack_peer, encode)
        self.trace.append(f"{p.id} {'request' if request else 'reply'} {unpack_peer(data)[0]}: {m.what}")
        legit = self._request(p, b + 1, True) if request else self._reply(p, b + 1)
        body = m.data + legit if after == "batch" else m.data
        self.relaying = (request and _kind(m.data) == PeerType.RELAY) or (
            _kind(legit) == PeerType.RELAY and after == "batch"
        )
        self.mutated += m.data != data and lid in self.core.links
        self.frames += 2 if after == "batch" else 1
        self.feed(LinkBytes(lid, body))
        self.relaying = False
        if len(m.data) < 4 or _LEN.unpack_from(m.data)[0] != len(m.data) - 4:
            if lid in self.core.links:  # (the stream is out of step: TCP drops it, as a peer's restart would)
                self.feed(LinkClosed(lid, "fuzz: framing"))
                self._gone(lid)
        elif after == "then-legit" and lid in self.core.links:
            self.frames += 1
            self.feed(LinkBytes(lid, legit))

    def _handshake_step(self, p: Peer, kind: str, b: int, c: int) -> None:
        """A frame read before authentication, mutated (``b & 3``): the HELLO of a new link from p,
        its AUTH (then closed: a second link), p's CHALLENGE or a REFUSED on a link the member
        dials to p."""
        which, where = b & 3, b >> 2
        if which >= 2:
            self._dial_step(p, kind, where, c, refused=which == 3)
            return
        nonce = bytes([0x20 + p.n]) * 16
        hello = encode([PeerType.HELLO, PROTOCOL, p.id, nonce, self.core.shape])
        if which == 1:
            m = mutate_packed(hello, kind, where, self.values, c, unpack_peer, encode)
            self.trace.append(f"{p.id} HELLO: {m.what}")
            lid = self.dial_in(p, m.data)
            self.mutated += m.data != hello and self.hello_fed
        else:
            self.manual = True
            lid = self.dial_in(p, hello)
            self.manual = False
            challenge = self.challenges.pop(lid, None)
            if challenge is None:
                return
            auth = encode([PeerType.AUTH, mac(self.secret, b"D", challenge[2], nonce, p.id, self.core.id)])
            m = mutate_packed(auth, kind, where, self.values, c, unpack_peer, encode)
            self.trace.append(f"{p.id} AUTH: {m.what}")
            self.handshakes.pop(lid, None)
            if lid in self.core.links:
                self.mutated += m.data != auth
                self.feed(LinkBytes(lid, m.data))
        self.frames += 1
        if lid in self.core.links and lid != p.inbound:
            self.feed(LinkClosed(lid, "fuzz: done"))
            self._gone(lid)

    def _dial_step(self, p: Peer, kind: str, where: int, c: int, refused: bool) -> None:
        """The member dials p (its link to p closed first, as a restart of p would close it), and p
        answers its HELLO with a CHALLENGE, or a REFUSED, mutated. A link left half-way is closed
        (the member dials again, and the rig answers as p then)."""
        core = self.core
        if p.outbound is not None:
            lid = p.outbound
            self.feed(LinkClosed(lid, "fuzz: redial"))
            self._gone(lid)
        self.dialled = p
        try:
            self.tick(core.s.reconnect_interval)
        finally:
            self.dialled = None
        if not self.hellos:
            return
        lid, hello = self.hellos.popitem()
        self.hellos.clear()
        if refused:
            frame = encode([PeerType.REFUSED,
                            f"peer runs {core.shape!r}, this member 'partitioned/7/3': [cluster] mode, "
                                       "partitions and replicas must be the same on every member"])  # fmt: skip
        else:
            nonce = bytes([0x40 + p.n]) * 16
            frame = encode([PeerType.CHALLENGE, p.id, nonce, mac(self.secret, b"L", hello[3], nonce, p.id, core.id),
                            core.shape])  # fmt: skip
            self.handshakes[lid] = (p, nonce)
        m = mutate_packed(frame, kind, where, self.values, c, unpack_peer, encode)
        self.trace.append(f"{p.id} {'REFUSED' if refused else 'CHALLENGE'}: {m.what}")
        self.frames += 1
        if lid in core.links:
            self.mutated += m.data != frame
            self.feed(LinkBytes(lid, m.data))
        if lid in core.links and lid != p.outbound:
            self.feed(LinkClosed(lid, "fuzz: done"))
            self._gone(lid)

    # ------------------------------------------------------------ the end of an example

    def finish(self) -> bool:
        """The final checks; True if the member still served and a legitimate client was served."""
        core = self.core
        checks.broker_consistent(core.broker)
        checks.status_encodes({**core.broker.status(), **core.status()})
        if core.phase != "ready" or core.id not in core.roster.members():
            return False
        self.trace.append("legitimate clients")
        topic = next(f"fresh{i}" for i in range(1000) if core.own.primaries[core.own.partition(f"fresh{i}")]
                     in (core.id, None) or not core.partitioned)  # fmt: skip
        sub, pub = BinClient(8, ("127.0.0.9", 7001)), BinClient(9, ("127.0.0.9", 7002))
        self.by_addr.update({sub.addr: sub, pub.addr: pub})
        for x in (sub, pub):
            self.feed(Datagrams([(x.hello(), x.addr)]))
            assert x.cookie != b"\x00" * 16, "no WELCOME for a fresh client"
        self.feed(Datagrams([(wire.encode_cmds(sub.cid, sub.cookie, 1, 1, [(1, topic, None, 1)]), sub.addr)]))
        msg = [wire.pack_message(topic, None, None, b"hello")]
        self.feed(Datagrams([(wire.encode_pub(pub.cid, pub.cookie, pub.pid, 1, 1, True, msg), pub.addr)]))
        assert sub.got == [b"hello"], f"the fresh subscriber got {sub.got} from the member"
        return True
