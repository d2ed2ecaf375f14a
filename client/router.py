"""Routing a client's publishes and subscriptions by the cluster map, sans-IO (:class:`Router`).

Theory of operation (docs/cluster.md, "Clients and the map")
------------------------------------------------------------
A partitioned cluster keeps a topic's subscriptions on its
partition's owners and delivers from the primary. Any member serves any
client (a PUB for a partition it does not lead is forwarded over a peer
link), but a client that sends each PUB and SUB straight to the primary
saves that hop and the forwarding queue. The members tell the client their
cluster map: in WELCOME (or, when it does not fit, on request with MAP) and
in a REDIRECT when a PUB or SUB reaches a member that is not the primary.
The router keeps the map of the highest epoch any of its sessions was given.

One :class:`ClientSession` talks to one member, and one client id has one
home member, so the router keeps one session per member it needs, opened
lazily, each with its own client id and producer ids derived from the
user's (:func:`derive_id`: BLAKE2b of the user's id and the member id, so a
restarted process with the same client id finds its own records again).
The first session is the user's: the user's ids, the node the user named.

Rules:

- **No map** (a single node, a replicated cluster, a member that has not
  sent one): everything goes to the first session, exactly as a plain
  :class:`ClientSession` would; nothing else is ever opened.
- **SUB** goes to the session of the topic's primary and stays there for
  the subscription's life: moving a live reliable subscription would lose or
  duplicate messages, and it need not move: members deliver from the
  partition's primary straight to the subscriber's address, whatever member
  the session talks to, and each session fails over on its own.
- **PUB** goes to the session of the topic's primary, but a producer's
  order must hold: a topic is bound to one session, and the binding moves to
  the new primary's session only once the old one has every message of that
  topic acknowledged (``flushed(last seq of the topic)``). Until then the old
  session carries on (its member forwards).

Reliable publishes get a router-wide sequence (the first session's own
sequence when there is no map), and ``acked`` is cumulative over them, so
callers see one producer whatever the number of sessions.

A client shell (client/library.py for trio, client/aio.py for asyncio) opens a socket for every session in
:attr:`Router.sessions` (it grows when a route needs a new member), feeds
each session its own datagrams through :meth:`Router.handle_datagrams` and
ticks it; MSGS for a session's client id come to that session's socket.
"""

from __future__ import annotations

import hashlib
from collections import deque
from typing import TYPE_CHECKING, Any

from roost.client import wire
from roost.client.durablewire import PUT_NO_QUORUM
from roost.client.putter import Putter
from roost.client.session import Addr, ClientConfig, ClientSession, SubState
from roost.client.subjects import partition_topic

if TYPE_CHECKING:
    from roost.client.clustermap import ClusterMap

__all__ = ["Router", "derive_id"]

SubKey = tuple[str, str | None]
#: Bindings of topics to sessions beyond this many are pruned where nothing is in flight.
MAX_BINDINGS = 65536


def derive_id(base: bytes, member: str) -> bytes:
    """The 16-byte id a session to ``member`` uses in place of ``base`` (a client or producer id)."""
    return hashlib.blake2b(base + b"\0" + member.encode(), digest_size=16, person=b"roost.route").digest()


class Router:
    def __init__(
        self, client_id: bytes, producer_id: bytes, fire_producer_id: bytes, config: ClientConfig, now: float,
        node: Addr = ("127.0.0.1", 7400), members: list[Addr] | None = None, session: int = 0,
    ) -> None:  # fmt: skip
        self.ids = (client_id, producer_id, fire_producer_id)
        self.cfg = config
        self.session_number = session
        self.first = ClientSession(client_id, producer_id, fire_producer_id, config, now, node=node,
                                   members=members, session=session)  # fmt: skip
        self.sessions: list[ClientSession] = [self.first]
        self.by_member: dict[str, ClientSession] = {}  # member -> the session opened for it
        self.cmap: ClusterMap | None = None
        self._now = now
        self._bind: dict[str, tuple[ClientSession, int]] = {}  # topic -> (session, its last reliable seq of it)
        # Without a map every publish goes to the first session and binds nothing; the first map
        # fences them: until the first session has acknowledged all it had then, every topic's
        # publishes stay there (and bind), so no topic's order is split across two members.
        self._fence: tuple[ClientSession, int] | None = None
        self._sub_at: dict[SubKey, ClientSession] = {}
        self._pending: deque[list[Any]] = deque()  # runs [router seq, session, its seq, count] (see offer)
        self._next = 1  # the next router-wide reliable sequence
        self._acked = 0
        # Durable publishes: one producer id for every session, a stream per partition (client/putter.py)
        self.putter = Putter(derive_id(producer_id, "durable"), config)
        self._put_to: dict[int, str] = {}  # partition -> the primary its puts went to last
        self._silent: dict[str, float] = {}  # member -> when puts to it last went unanswered (``_learn``)

    # ------------------------------------------------------------ routes

    def session_for(self, topic: str) -> ClientSession:
        """The session of the topic's primary by the current map (the first one without a map)."""
        cmap = self.cmap
        if cmap is None:
            return self.first
        primary = cmap.primary(topic)
        if primary is None:
            return self.first  # no live owner: any member will do (it counts the drop)
        s = self.by_member.get(primary)
        if s is None:
            s = self._open(primary, cmap)
        return s

    def durable_session(self, member: str) -> ClientSession:
        """The session a durable request to ``member`` (a partition's leader) goes through,
        talking to that member. Members do not forward durable requests, so a session that
        failed over to another member while ``member`` was away (paused, cut off) would be
        refused for ever: once the map names ``member`` again, the session goes back to it.

        Only once it is connected there (``node_id`` is that of its last WELCOME), and not before
        we know the map of the member it reached if that announced a newer one than ours (asked
        for with MAP, or sent with its refusal of our request): that map may no longer name
        ``member`` (it left). Moved back at once, it never got an answer anywhere (simulator
        seed 2342)."""
        cmap = self.cmap
        assert cmap is not None
        s = self.by_member.get(member) or self._open(member, cmap)
        known = s.cmap.epoch if s.cmap is not None else 0  # (the session's newest: ours may be another member's)
        if s.cookie is not None and s.node_id != member and s.announced <= known:
            s.move_to(cmap.address(member), self._now)
        return s

    def durable_session_for(self, topic: str) -> ClientSession:
        """``durable_session`` of the topic's primary (the first session without a map or owner)."""
        primary = self.cmap.primary(topic) if self.cmap is not None else None
        return self.first if primary is None else self.durable_session(primary)

    def _open(self, member: str, cmap: ClusterMap) -> ClientSession:
        cid, pid, fpid = (derive_id(x, member) for x in self.ids)
        others = [cmap.address(m) for m in sorted(cmap.members) if m != member]
        s = ClientSession(cid, pid, fpid, self.cfg, self._now, node=cmap.address(member), members=others,
                          session=self.session_number)  # fmt: skip
        self.by_member[member] = s
        self.sessions.append(s)
        return s

    def _learn(self, s: ClientSession) -> None:
        """Adopt a map a session was just given if it is newer than ours, or if its member says it
        does not lead a partition ours says it leads; note which member the first session is.

        Members' epochs differ (docs/cluster.md: a restarted member starts low again), so the
        highest epoch we were given may be a map its member has long left behind, and every
        member that could correct it may send lower ones: a durable request sent by it to a
        member that no longer leads was refused, with that member's map, for ever (simulator
        seed 7). A member knows which partitions it leads now, and whether a member we cannot reach is up."""
        if s is self.first and s.node_id is not None and not self.by_member:
            self.by_member[s.node_id] = s
        m, s.heard_map = s.heard_map, None
        ours = self.cmap
        if m is None:
            return
        if ours is None or m.epoch > ours.epoch:
            if ours is None:  # (publishes bound to no topic so far: all of them stay on the first session)
                self._fence = (self.first, self.first.last_seq)
            self.cmap = m
        elif s.node_id is not None and m.partitions == ours.partitions:  # (older, or as old: epochs are per member)
            me = (s.node_id,)
            disowned = any(o[:1] == me and t[:1] != me for o, t in zip(ours.owners, m.owners, strict=True))
            # (or the member this session was opened for fell silent, and the one it reached holds it down:
            # a member that left, whose high epoch no one else reaches again; simulator seed 459)
            gone = any(v is s and x != s.node_id and x in ours.live and x not in m.live
                       for x, v in self.by_member.items())  # fmt: skip
            # (or it holds down a member whose puts went unanswered lately: after a leader's kill our
            # map may be another member's, of a higher epoch, that no one sends again)
            recent = self._now - 10.0
            silent = any(x in ours.live and x not in m.live and t > recent for x, t in self._silent.items())
            # (or ours names no live owner of a partition this one has one for: the last map of a
            # member that left has no live member at all, and held every put back; seed 6656)
            orphaned = any(t and not o for o, t in zip(ours.owners, m.owners, strict=True))
            if disowned or gone or orphaned or silent:
                self.cmap = m
                self._silent.clear()

    # ------------------------------------------------------------ publishing

    def pub_session(self, topic: str) -> ClientSession:
        """The session a publish of ``topic`` goes to now: its bound session until that one has
        every message of the topic acknowledged, then the primary's."""
        if self.cmap is None:
            return self.first
        fence = self._fence
        if fence is not None:
            if not fence[0].flushed(fence[1]):
                return fence[0]
            self._fence = None
        target = self.session_for(topic)
        b = self._bind.get(topic)
        if b is None:
            if len(self._bind) >= MAX_BINDINGS:
                self._prune()
            self._bind[topic] = (target, 0)
            return target
        s, last = b
        if s is not target and s.flushed(last):
            self._bind[topic] = (target, 0)
            return target
        return s

    def _prune(self) -> None:
        for topic, (s, last) in list(self._bind.items()):
            if s.flushed(last):
                del self._bind[topic]

    def window_full(self, topic: str) -> bool:
        """Would a reliable publish of ``topic`` have to wait for room?"""
        return self.pub_session(topic).window_full

    def offer(self, topic: str, key: str | None, tags: dict[str, str] | None, payload: bytes,
              reliable: bool, wait_for_room: bool = True) -> int | None:  # fmt: skip
        """``publish``, unless a reliable publish would have to wait for room (None; with
        ``wait_for_room`` False it is queued past the window): the API's common case in one
        call, the session looked up once."""
        s = self.first if self.cmap is None else self.pub_session(topic)
        pub = s.pub
        if not reliable:
            pub.publish(topic, key, tags, payload, False)
            return 0
        q, cfg = pub.unacked, pub.cfg  # (Publisher.window_full, written out: it costs less than the call)
        if wait_for_room and (len(q) >= cfg.pub_window or (pub.unacked_bytes >= cfg.pub_window_bytes and q)):
            return None
        seq = pub.publish(topic, key, tags, payload, True)
        if self.cmap is not None:
            self._bind[topic] = (s, seq)
        g = self._next
        self._next = g + 1
        # (a run of consecutive publishes through one session is one entry: [router seq, session,
        # its seq, count]; a message is a sequence or, past the window, parts with one each)
        p = self._pending
        if p:
            last = p[-1]
            if last[1] is s and last[0] + last[3] == g and last[2] + last[3] == seq:
                last[3] += 1
                return g
        p.append([g, s, seq, 1])
        return g

    def publish(self, topic: str, key: str | None, tags: dict[str, str] | None, payload: bytes,
                reliable: bool) -> int:  # fmt: skip
        """Queue a message (past the window, if it is full); returns its router-wide reliable
        sequence (0 for fire)."""
        seq = self.offer(topic, key, tags, payload, reliable, False)
        assert seq is not None
        return seq

    @property
    def last_seq(self) -> int:
        """The router-wide sequence of the last reliable publish (0: none yet)."""
        return self._next - 1

    @property
    def acked(self) -> int:
        """Every reliable publish through this router-wide sequence is acknowledged."""
        self._advance()
        return self._acked

    def _advance(self) -> None:
        p = self._pending
        while p:
            g, s, seq, n = p[0]
            done = s.acked - seq  # (how far into the run its session's acknowledgements reach)
            if done >= n - 1:
                self._acked = g + n - 1
                p.popleft()
                continue
            if done >= 0:
                self._acked = g + done
            return

    def flush_marks(self) -> list[tuple[ClientSession, int]]:
        """What ``flushed`` waits for: each session's last reliable sequence now."""
        return [(s, s.last_seq) for s in self.sessions]

    @staticmethod
    def flushed(marks: list[tuple[ClientSession, int]]) -> bool:
        return all(s.flushed(seq) for s, seq in marks)

    # ------------------------------------------------------------ durable publishing

    def put(self, topic: str, key: str | None, tags: dict[str, str] | None, payload: bytes) -> tuple[int, int]:
        """Queue a durable publish; returns (partition, its sequence there). It goes to the
        partition's primary (docs/durable.md): ValueError without a cluster map."""
        cmap = self.cmap
        if cmap is None:
            raise ValueError("durable publishes need a partitioned cluster (no cluster map from the node)")
        wire.check_topic(topic)
        wire.check_key(key)
        wire.check_tags(tags)
        p = cmap.partition(topic)
        packed = wire.pack_message(topic, key, tags, payload)
        limit = min(s.max_datagram for s in self.sessions)  # (whichever owner leads it later must take it)
        wire.check_fits(len(packed), limit, wire.FRAME_OVERHEAD * 3)  # (PUT's header is longer)
        seq = self.putter.put(p, packed)
        self._pump_puts(self._now)
        return p, seq

    def put_window_full(self, topic: str) -> bool:
        return self.cmap is not None and self.putter.window_full(self.cmap.partition(topic))

    def _pump_puts(self, now: float) -> None:
        """PUT datagrams that are due, each into the session of its partition's primary."""
        cmap, putter = self.cmap, self.putter
        if cmap is None:
            return
        for p in putter.streams:
            owners = cmap.owners[p]
            if owners and self._put_to.get(p) != owners[0]:  # (a new primary: what waits goes to it now)
                self._put_to[p] = owners[0]
                putter.moved(p, now)
            if not putter.due(p, now):
                continue
            if not owners:  # (no live owner: a newer map will name one; ask for it, each pub_retry)
                self.ask_elsewhere(None, now)
                putter.hold(p, now + self.cfg.pub_retry)
                continue
            s = self.durable_session(owners[0])
            if putter.timed_out(p, now):  # (unanswered: its primary may be down, and our map not know it yet)
                self._silent[owners[0]] = now
                self.ask_elsewhere(owners[0], now)
            if s.cookie is None:
                putter.hold(p, now + self.cfg.hello_retry)  # (not connected yet: its WELCOME comes, then the next pump)
                continue
            s.queue_raw(putter.frames(p, s.cid, s.cookie, s.max_datagram, now))

    def ask_elsewhere(self, away: str | None, now: float) -> None:
        """Member ``away`` is cut off from the quorum (its map may name its own side, and ours may be
        old), or it did not answer a put (it may be down, and our map not know it yet), or our map
        names no live owner: ask the other members we talk to for their maps (a newer one is taken:
        ``_learn``; each session asks at most once a second). A client that talks to no other
        member waits (opening sessions to others here cost cookie refusals in fault-free runs)."""
        for t in self.sessions:
            if t.node_id is not None and t.node_id != away:
                t.ask_map(now)

    def put_deadline(self) -> float:
        return self.putter.next_deadline()

    # ------------------------------------------------------------ subscribing

    def subscribe(self, topic: str, key: str | None, mode: int) -> tuple[ClientSession, SubState]:
        """Subscribe at the topic's primary; a subscription in force stays where it is (a new
        mode replaces it there)."""
        old = self._sub_at.get((topic, key))
        if old is not None and (topic, key) in old.subs:
            s = old
        else:  # (a filter goes where its pattern's partition is; a wildcard spans them: any member)
            home = partition_topic(topic)
            s = self.session_for(home) if home is not None else self.first
        st = s.subscribe(topic, key, mode)
        self._sub_at[(topic, key)] = s
        return s, st

    def unsubscribe(self, topic: str, key: str | None) -> None:
        s = self._sub_at.pop((topic, key), None)
        (s or self.first).unsubscribe(topic, key)

    # ------------------------------------------------------------ input and time

    def handle_datagrams(self, s: ClientSession, datagrams: list[tuple[bytes, Addr]], now: float) -> None:
        """Datagrams that arrived at session ``s``'s socket."""
        self._now = now
        s.handle_datagrams(datagrams, now)
        self._learn(s)
        self._advance()
        if s.putacks:
            for pid, p, acked, status in s.putacks:
                self.putter.on_putack(pid, p, acked, status, now)
                if status == PUT_NO_QUORUM:
                    self.ask_elsewhere(s.node_id, now)
            s.putacks.clear()
        self._pump_puts(now)

    def tick(self, s: ClientSession, now: float) -> None:
        self._now = now
        s.tick(now)
        self._advance()
        self._pump_puts(now)

    # ------------------------------------------------------------ over every session

    @property
    def connected(self) -> bool:
        return self.first.connected

    @property
    def lost(self) -> bool:
        """A session tried every member it knows without an answer."""
        return any(s.lost for s in self.sessions)

    @property
    def duplicates(self) -> int:
        return sum(s.duplicates for s in self.sessions)

    @property
    def failovers(self) -> int:
        return sum(s.failovers for s in self.sessions)
