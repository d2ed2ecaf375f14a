"""The client's protocol state machine, sans-IO.

One session talks to one node. It owns the handshake (HELLO/WELCOME cookie),
the ordered command batches (one in flight, retried with the same batch id,
Ray's PubsubCommandBatch), the reliable receive side (drop duplicates, hold
out-of-order messages, cumulative ACK plus SACK ranges), the publisher side
(producer id and sequences, a window of unacknowledged reliable publishes
retried until PUBACK) and liveness (PING while connected; ``node_lost`` when
the node has been silent for ``node_timeout``).

Inputs: API calls, datagrams and ticks, each with ``now``. Outputs:
:meth:`ClientSession.outgoing` (datagrams to send), per-subscription queues of
:class:`Message`, and :attr:`ClientSession.events`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, fields
from itertools import islice
from typing import Any, NamedTuple

from client import wire
from client.wire import E, Mode, Op, Reason, T, WireError

Addr = tuple[str, int]
MAX_HOLES = 65536  # per producer: sequences skipped by a jump that may still arrive


@dataclass
class ClientConfig:
    """Client timeouts and limits; every one can be set from code or TOML ``[client]``."""

    ping_interval: float = 0.5  # overridden by the node's WELCOME
    node_timeout: float = 1.5  # node silent this long: node_lost
    hello_retry: float = 0.25
    cmd_retry: float = 0.25
    pub_retry: float = 0.2
    pub_retry_max: float = 2.0
    pub_window: int = 8192  # reliable publishes in flight
    max_buffered: int = 100_000  # messages received but not yet consumed
    max_datagram: int = 16384  # until the node's WELCOME says otherwise

    @classmethod
    def from_mapping(cls, source: str, table: dict[str, Any]) -> ClientConfig:
        cfg = cls()
        known = {f.name: f for f in fields(cls)}
        for k, v in table.items():
            f = known.get(k)
            if f is None:
                raise ValueError(f"{source}: [client] {k}: unknown key; known: {', '.join(known)}")
            kind = int if f.type in ("int", int) else float
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 or (
                kind is int and not isinstance(v, int)
            ):
                raise ValueError(f"{source}: [client] {k} = {v!r}: must be a positive {kind.__name__}")
            setattr(cfg, k, kind(v))
        return cfg


class Message(NamedTuple):
    topic: str
    key: str | None
    tags: dict[str, str] | None
    payload: bytes
    sequence: int | None  # per-subscriber sequence (reliable); None for fire


class SubState:
    __slots__ = ("mode", "confirmed", "reason", "queue", "counted")

    def __init__(self, mode: int) -> None:
        self.mode = mode
        self.confirmed = False
        self.reason: str | None = None  # set once the subscription has ended
        self.queue: deque[Message] = deque()
        self.counted = True  # its queue counts towards ClientSession.buffered


class RecvStream:
    """Reliable receive state for the messages one node delivers to us."""

    __slots__ = ("stream", "expected", "ooo", "need_ack")

    def __init__(self) -> None:
        self.stream = 0
        self.expected = 1
        self.ooo: dict[int, tuple[Any, ...]] = {}
        self.need_ack = False


class ClientSession:
    def __init__(
        self, client_id: bytes, producer_id: bytes, fire_producer_id: bytes,
        config: ClientConfig, now: float, node: Addr = ("127.0.0.1", 7400),
        members: list[Addr] | None = None, session_epoch: int = 0,
    ) -> None:  # fmt: skip
        """``session_epoch`` (the shell passes Unix milliseconds) is the session
        field of every CMDS, so a node can tell a restarted client process that
        reuses its client id from a retry of the old one."""
        self.cid = client_id
        self.cfg = config
        self.max_datagram = config.max_datagram
        self.ping_interval = config.ping_interval
        self.node: Addr = node  # the node we talk to now
        # Every node we know of, in failover order; WELCOME's cluster map adds more.
        self.candidates: list[Addr] = [node, *(m for m in members or [] if m != node)]
        self.cookie: bytes | None = None
        self.node_id: str | None = None
        self.members: list[tuple[str, str, int]] = []
        self.last_heard = now
        self.next_hello = now
        self.next_ping = now
        self.ping_token = 0
        self.lost = False
        self.failed_attempts = 0  # nodes tried in a row without an answer
        self.failovers = 0
        self.events: list[tuple[Any, ...]] = []
        self.last_status: dict[str, Any] | None = None
        self._out: list[tuple[Addr, bytes]] = []
        # commands
        self.subs: dict[tuple[str, str | None], SubState] = {}
        self.queued: list[tuple[int, str, str | None, int]] = []
        self.inflight: tuple[int, list[tuple[int, str, str | None, int]]] | None = None
        self.inflight_at = 0.0
        self.session_epoch = session_epoch
        self.next_batch = 1
        self.confirmed_token = 0  # ping token current when a CMDACK last arrived
        # reliable receive: one sequence space per delivering node
        self.streams: dict[Addr, RecvStream] = {}
        self.seen: dict[bytes, int] = {}  # producer id -> highest sequence delivered
        self.holes: dict[bytes, set[int]] = {}  # producer id -> sequences below it not yet seen
        self.buffered = 0
        self.held = False  # in-order messages wait in ``ooo`` for buffer room
        self.duplicates = 0
        # publishing
        self.pid = producer_id
        self.fire_pid = fire_producer_id
        self.next_seq = 1
        self.fire_seq = 1
        self.acked = 0
        self.unacked: deque[tuple[int, bytes]] = deque()
        self.unsent_from = 1  # first reliable sequence not sent to the current node
        self.fire_pending: list[bytes] = []
        self.pub_rto = config.pub_retry
        self.pub_retry_at: float | None = None

    # ------------------------------------------------------------ API

    @property
    def connected(self) -> bool:
        return self.cookie is not None

    def subscribe(self, topic: str, key: str | None, mode: int) -> SubState:
        wire.check_topic(topic)
        wire.check_key(key)
        st = SubState(mode)
        old = self.subs.get((topic, key))
        if old is not None and old.reason is None:
            old.reason = Reason.UNSUBSCRIBED  # replaced: last command wins
            self._detach(old)
        self.subs[(topic, key)] = st
        self.queued.append((Op.SUB, topic, key, mode))
        return st

    def unsubscribe(self, topic: str, key: str | None) -> None:
        st = self.subs.pop((topic, key), None)
        if st is not None and st.reason is None:
            st.reason = Reason.UNSUBSCRIBED
            self._detach(st)
            st.queue.clear()
        self.queued.append((Op.UNSUB, topic, key, Mode.FIRE))

    def _detach(self, st: SubState) -> None:
        """An ended subscription's queue no longer counts as buffered; what is
        in it stays readable by the application."""
        if st.counted:
            st.counted = False
            self.buffered -= len(st.queue)

    def publish(
        self, topic: str, key: str | None, tags: dict[str, str] | None, payload: bytes, reliable: bool
    ) -> int:
        """Queue a message; returns its producer sequence (0 for fire)."""
        wire.check_topic(topic)
        wire.check_key(key)
        wire.check_tags(tags)
        packed = wire.pack_message(topic, key, tags, payload)
        if len(packed) + wire.FRAME_OVERHEAD * 2 > self.max_datagram:
            raise WireError(E.TOO_LARGE, f"message of {len(packed)} bytes does not fit a datagram")
        if not reliable:
            self.fire_pending.append(packed)
            return 0
        seq = self.next_seq
        self.next_seq += 1
        self.unacked.append((seq, packed))
        return seq

    @property
    def window_full(self) -> bool:
        return len(self.unacked) >= self.cfg.pub_window

    def consumed(self, st: SubState) -> None:
        """The application took one message from ``st``'s queue."""
        if st.counted:
            self.buffered -= 1
            if self.held and self.buffered < self.cfg.max_buffered:
                self.held = False
                self._drain_held()

    def _drain_held(self) -> None:
        """Room again: deliver what waited in order behind a full buffer."""
        limit = self.cfg.max_buffered
        for rs in self.streams.values():
            while rs.expected in rs.ooo:
                if self.buffered >= limit:
                    self.held = True
                    return
                self._deliver(rs.ooo.pop(rs.expected), rs.expected)
                rs.expected += 1
                rs.need_ack = True

    # ------------------------------------------------------------ input

    def handle_datagrams(self, datagrams: list[tuple[bytes, Addr]], now: float) -> None:
        known = self.candidates
        for data, src in datagrams:
            if src != self.node and src not in known:
                self.events.append(("stranger", src))
                continue  # only nodes of our cluster may talk to us
            try:
                f = wire.decode_untrusted_frame(data, 65536)
            except WireError:
                self.events.append(("bad_datagram", len(data)))
                continue
            if src == self.node:
                self.last_heard = now
            self._on_frame(f, src, now)

    def _on_frame(self, f: tuple[Any, ...], src: Addr, now: float) -> None:
        ftype = f[0]
        if ftype is T.MSGS:
            self._on_msgs(src, f[1], f[2], f[3])
            return
        if ftype is T.CANCEL:  # may come from any node that delivers to us
            self._on_cancel(f[1], f[2], f[3])
            return
        if src != self.node:
            return  # the rest is conversation with our current node
        if ftype is T.PUBACK:
            self._on_puback(f[1], f[2], now)
        elif ftype is T.CMDACK:
            if f[1] == self.session_epoch:
                self._on_cmdack(f[2], f[3])
        elif ftype is T.PONG:
            self._on_pong(f[1], f[2], f[3], f[4])
        elif ftype is T.WELCOME:
            self._on_welcome(f[1], f[2], f[3], f[4])
        elif ftype is T.ERROR:
            if f[1] == E.BAD_COOKIE:
                self.cookie = None
                self.next_hello = now
            self.events.append(("error", f[1], f[2]))
        elif ftype is T.STATUS_REPLY:
            self.last_status = f[1]

    def _on_welcome(self, node_id: str, cookie: bytes, params: dict[str, Any], members: list[Any]) -> None:
        self.node_id, self.cookie, self.members = node_id, cookie, members
        for _, host, port in members:
            if (host, port) not in self.candidates:
                self.candidates.append((host, port))
        md = params.get("max_datagram")
        if isinstance(md, int) and 1200 <= md <= 65507:
            self.max_datagram = min(md, self.cfg.max_datagram)
        pi = params.get("ping_interval")
        if isinstance(pi, (int, float)) and 0.01 <= pi <= 60:
            self.ping_interval = float(pi)
        self.lost = False
        self.failed_attempts = 0
        self.events.append(("connected", node_id))

    def _on_msgs(self, src: Addr, stream: int, first: int, msgs: list[tuple[Any, ...]]) -> None:
        if stream == 0:
            for m in msgs:
                if self.buffered >= self.cfg.max_buffered:
                    self.events.append(("fire_dropped", 1))
                    continue
                self._deliver(m, None)
            return
        rs = self.streams.get(src)
        if rs is None:
            rs = self.streams[src] = RecvStream()
        if stream < rs.stream:
            return  # a datagram from a stream the node has abandoned
        if stream > rs.stream:
            rs.stream, rs.expected = stream, 1
            rs.ooo.clear()
        rs.need_ack = True
        seq = first
        limit = self.cfg.max_buffered
        for m in msgs:
            if seq == rs.expected and self.buffered < limit:
                self._deliver(m, seq)
                rs.expected += 1
                while rs.expected in rs.ooo and self.buffered < limit:
                    self._deliver(rs.ooo.pop(rs.expected), rs.expected)
                    rs.expected += 1
                if rs.expected in rs.ooo:
                    self.held = True
            elif seq == rs.expected:
                break  # buffer full: not acknowledged, the node resends later
            elif seq < rs.expected or seq in rs.ooo:
                self.duplicates += 1
            elif len(rs.ooo) < self.cfg.pub_window * 4:
                rs.ooo[seq] = m
            seq += 1

    def _deliver(self, m: tuple[Any, ...], seq: int | None) -> None:
        if len(m) == 6:
            # Reliable messages name their producer: a resend after failover
            # that the failed node had already delivered is dropped here. Two
            # members' streams are not ordered with each other, so sequences
            # skipped by a jump are remembered and still accepted later.
            pid, pseq = m[4], m[5]
            high = self.seen.get(pid, 0)
            if pseq <= high:
                holes = self.holes.get(pid)
                if holes is None or pseq not in holes:
                    self.duplicates += 1
                    return
                holes.discard(pseq)
            else:
                if pseq > high + 1 and high:
                    holes = self.holes.setdefault(pid, set())
                    holes.update(range(max(high + 1, pseq - MAX_HOLES), pseq))
                    if len(holes) > MAX_HOLES:
                        for s in sorted(holes)[: len(holes) - MAX_HOLES]:
                            holes.discard(s)
                self.seen[pid] = pseq
        topic, key = m[0], m[1]
        msg = Message(topic, key, m[2], m[3], seq)
        st = self.subs.get((topic, None))
        if st is not None and st.reason is None:
            st.queue.append(msg)
            self.buffered += 1
        if key is not None:
            st = self.subs.get((topic, key))
            if st is not None and st.reason is None:
                st.queue.append(msg)
                self.buffered += 1

    def _on_puback(self, pid: bytes, acked: int, now: float) -> None:
        if pid != self.pid or acked <= self.acked:
            return
        acked = min(acked, self.next_seq - 1)
        self.acked = acked
        q = self.unacked
        while q and q[0][0] <= acked:
            q.popleft()
        self.pub_rto = self.cfg.pub_retry
        self.pub_retry_at = now + self.pub_rto if q and self.unsent_from > q[0][0] else None
        self.events.append(("puback", acked))

    def _on_cmdack(self, batch: int, results: list[int]) -> None:
        if self.inflight is None or self.inflight[0] != batch:
            return
        cmds = self.inflight[1]
        self.inflight = None
        self.confirmed_token = self.ping_token
        for (op, topic, key, _), code in zip(cmds, results, strict=False):
            st = self.subs.get((topic, key))
            if op != Op.SUB or st is None:
                continue
            if code == E.OK:
                st.confirmed = True
            elif st.reason is None:
                st.reason = "refused: " + _error_name(code)
                del self.subs[(topic, key)]
        self.events.append(("cmdack", batch))

    def _on_pong(self, token: int, known: bool, cookie: bytes, cancels: list[tuple[Any, ...]]) -> None:
        self.cookie = cookie
        if token > self.confirmed_token:
            # (a PONG older than our last CMDACK may list a cancellation we
            # already confirmed, of a subscription we have since renewed)
            for topic, key, reason in cancels:
                self._on_cancel(topic, key, reason)
        if not known and token > self.confirmed_token and self.inflight is None and not self.queued:
            # The node has no state for us although it confirmed our
            # subscriptions: it dropped us (subscriber_timeout). Messages were
            # lost in between, so end the subscriptions rather than pretend.
            for (topic, key), st in list(self.subs.items()):
                if st.confirmed:
                    self._end(topic, key, Reason.TIMED_OUT)

    def _on_cancel(self, topic: str, key: str | None, reason: str) -> None:
        st = self.subs.get((topic, key))
        if st is not None:
            self._end(topic, key, reason)
        # Tell the node we saw it, so it stops repeating the cancellation.
        self.queued.append((Op.UNSUB, topic, key, Mode.FIRE))

    def _end(self, topic: str, key: str | None, reason: str) -> None:
        st = self.subs.pop((topic, key))
        st.reason = reason
        self._detach(st)
        self.events.append(("cancelled", topic, key, reason))

    # ------------------------------------------------------------ time

    def tick(self, now: float) -> None:
        if self.cookie is None:
            if now >= self.next_hello:
                self._out.append((self.node, wire.encode_hello(self.cid)))
                self.next_hello = now + self.cfg.hello_retry
        elif now >= self.next_ping:
            self.ping_token += 1
            self._out.append((self.node, wire.encode_ping(self.cid, self.cookie, self.ping_token)))
            self.next_ping = now + self.ping_interval
        if now >= self.last_heard + self.cfg.node_timeout:  # (the same sum as next_deadline)
            self._node_silent(now)
        if self.inflight is not None and now >= self.inflight_at and self.cookie is not None:
            self._send_batch(now)
        if self.pub_retry_at is not None and now >= self.pub_retry_at and self.unacked:
            self.unsent_from = self.unacked[0][0]  # go back N: resend all in flight
            self.pub_rto = min(self.pub_rto * 2, self.cfg.pub_retry_max)
            self.pub_retry_at = now + self.pub_rto
            self.events.append(("pub_retry", len(self.unacked)))

    def _node_silent(self, now: float) -> None:
        """Our node said nothing for node_timeout: try the next member."""
        self.failed_attempts += 1
        self.events.append(("node_silent", self.node))
        if not self.lost and self.failed_attempts >= len(self.candidates):
            # Every node we know was tried: the subscriptions cannot go on.
            self.lost = True
            for topic, key in list(self.subs):
                self._end(topic, key, Reason.NODE_LOST)
                self.queued.append((Op.UNSUB, topic, key, Mode.FIRE))
            self.events.append(("node_lost",))
        i = self.candidates.index(self.node) if self.node in self.candidates else -1
        self.node = self.candidates[(i + 1) % len(self.candidates)]
        self.cookie = None
        self.next_hello = now
        self.last_heard = now
        if not self.lost:
            self.failovers += 1
            self._resume_elsewhere()

    def _resume_elsewhere(self) -> None:
        """Carry our state to the next node: subscriptions again, commands in
        flight again (they are idempotent), unacknowledged publishes again
        (the producer sequence keeps them from being delivered twice)."""
        resub: list[tuple[int, str, str | None, int]] = [
            (Op.SUB, t, k, st.mode) for (t, k), st in self.subs.items()
        ]
        if self.inflight is not None:
            resub = self.inflight[1] + resub
            self.inflight = None
        self.queued = resub + self.queued
        if self.unacked:
            self.unsent_from = self.unacked[0][0]
        self.pub_rto = self.cfg.pub_retry

    def next_deadline(self) -> float:
        d = [self.last_heard + self.cfg.node_timeout]
        d.append(self.next_hello if self.cookie is None else self.next_ping)
        # (only deadlines that tick() acts on: any other would wake it for nothing, forever)
        if self.inflight is not None and self.cookie is not None:
            d.append(self.inflight_at)
        if self.pub_retry_at is not None and self.unacked:
            d.append(self.pub_retry_at)
        return min(d)

    # ------------------------------------------------------------ output

    def status_request(self) -> None:
        if self.cookie is not None:
            self._out.append((self.node, wire.encode_status(self.cid, self.cookie)))

    def outgoing(self, now: float) -> list[tuple[Addr, bytes]]:
        """Everything to send now, with its destination."""
        cookie = self.cookie
        if cookie is not None:
            for src, rs in self.streams.items():
                if rs.need_ack:
                    rs.need_ack = False
                    sack = _ranges(sorted(rs.ooo))
                    self._out.append((src, wire.encode_ack(self.cid, cookie, rs.stream, rs.expected - 1, sack)))
            if self.inflight is None and self.queued:
                batch, self.queued = self.queued[:256], self.queued[256:]
                self.inflight = (self.next_batch, batch)
                self.next_batch += 1
                self._send_batch(now)
            if self.fire_pending:
                self.fire_seq = self._emit_pubs(self.fire_pid, self.fire_seq, self.fire_seq, False, self.fire_pending)
                self.fire_pending = []
            q = self.unacked
            if q and self.unsent_from <= q[-1][0]:
                start = self.unsent_from - q[0][0]
                todo = [p for _, p in _islice(q, start)]
                self._emit_pubs(self.pid, self.unsent_from, self.acked + 1, True, todo)
                self.unsent_from = q[-1][0] + 1
                if self.pub_retry_at is None:
                    self.pub_retry_at = now + self.pub_rto
        out, self._out = self._out, []
        return out

    def _send_batch(self, now: float) -> None:
        assert self.inflight is not None and self.cookie is not None
        self._out.append((self.node, wire.encode_cmds(self.cid, self.cookie, self.session_epoch, *self.inflight)))
        self.inflight_at = now + self.cfg.cmd_retry

    def _emit_pubs(self, pid: bytes, first: int, floor: int, reliable: bool, packed: list[bytes]) -> int:
        """PUB datagrams for consecutive sequences from ``first``; returns the next one."""
        assert self.cookie is not None
        budget = self.max_datagram - wire.FRAME_OVERHEAD - 2 * wire.ID_LEN - wire.COOKIE_LEN
        start = size = 0
        node, out = self.node, self._out
        for i, p in enumerate(packed):
            if size + len(p) > budget and i > start:
                out.append((node, wire.encode_pub(self.cid, self.cookie, pid, first, floor, reliable, packed[start:i])))
                first += i - start
                if not reliable:
                    floor = first
                start, size = i, 0
            size += len(p)
        out.append((node, wire.encode_pub(self.cid, self.cookie, pid, first, floor, reliable, packed[start:])))
        return first + len(packed) - start


def _islice(q: deque[tuple[int, bytes]], start: int) -> list[tuple[int, bytes]]:
    return list(q) if start == 0 else list(islice(q, start, None))


def _error_name(code: int) -> str:
    try:
        return E(code).name.lower()
    except ValueError:
        return f"error {code}"


def _ranges(seqs: list[int]) -> list[list[int]]:
    """[3,4,5,9] -> [[3,5],[9,9]]: SACK ranges, at most 64 of them."""
    out: list[list[int]] = []
    for s in seqs:
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            if len(out) == 64:
                break
            out.append([s, s])
    return out
