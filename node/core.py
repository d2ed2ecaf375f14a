"""The broker core: datagrams and time in, datagrams and log events out.

Sans-IO (DESIGN.md): no sockets, clocks, trio or global randomness here. The
shell (``node/server.py``) drains every datagram that is ready, hands the whole
batch to :meth:`BrokerCore.handle_datagrams` and sends what comes back; it calls
:meth:`BrokerCore.tick` when :meth:`BrokerCore.next_deadline` passes. Output is
coalesced per destination: all messages for one subscriber produced by one
batch leave in as few MSGS datagrams as the datagram size allows.

Bad input never raises out of here and never changes state: every decoder
error becomes an ERROR reply (or a counted drop where a reply could amplify
traffic towards an unvalidated address).
"""

from __future__ import annotations

import heapq
import ipaddress
import math
import random
from collections import Counter
from typing import Any, NamedTuple

import mmh3

from client import wire
from client.text import encode_text_error, encode_text_msg, parse_untrusted_text
from client.wire import E, Mode, Op, Reason, T, WireError
from node import versions
from node.config import NodeConfig
from node.cookies import Addr, CookieJar
from node.mailbox import Mailbox
from node.subscriptions import SubscriptionIndex


class Send(NamedTuple):
    addr: Addr
    data: bytes


class Log(NamedTuple):
    level: str
    event: str
    fields: dict[str, Any]


class Replicate(NamedTuple):
    """Local changes of replicated registers, to be pushed to every peer."""

    entries: list[list[Any]]


class StatusQuery(NamedTuple):
    """A client asked for status: the shell (or member core) answers with
    ``status`` plus whatever it knows beyond this core (the cluster view)."""

    addr: Addr
    status: dict[str, Any]


Action = Send | Log | Replicate | StatusQuery

# Timer kinds in the heap.
_RTO, _LIVENESS, _LEASE, _PRODUCER = range(4)

# An unvalidated address never gets more than this many times the bytes it sent.
AMPLIFICATION = 3

# Replica digests: registers hash into this many buckets; anti-entropy compares
# bucket digests (XOR of (key hash, version) mixes) and ships differing buckets.
DIGEST_BUCKETS = 256
# Why a tombstone was written (bits 2-3 of its version).
REASON_UNSUBSCRIBED, REASON_OUT_OF_CAPACITY, REASON_TIMED_OUT = 0, 1, 2
# Replicated versions may be at most this far ahead of our clock (seconds).
MAX_CLOCK_SKEW = 60.0


def _key_hash(who: Any, tk: tuple[str, str | None] | None) -> tuple[int, int]:
    """(bucket, 64-bit hash) of a register: a subscription, or the client's own."""
    raw = who if who.__class__ is bytes else f"{who[0]}|{who[1]}".encode()
    if tk is not None:
        raw += b"\0" + tk[0].encode() + b"\0" + (tk[1] or "").encode() + (b"\1" if tk[1] is None else b"")
    h = mmh3.hash64(raw, signed=False)[0]
    return h & (DIGEST_BUCKETS - 1), h


_M64 = (1 << 64) - 1


def _mix(h: int, version: int) -> int:
    """A register's share of its bucket digest; 0 for "absent". ``h`` is already
    a uniform 64-bit key hash; odd multipliers spread the version over all bits."""
    return 0 if version == 0 else ((h * 0x9E3779B97F4A7C15) ^ (version * 0xC2B2AE3D27D4EB4F)) & _M64


class ClientState:
    """A subscriber: a binary client (keyed by client id) or a text-protocol
    address (keyed by that address). Its subscriptions are versioned
    registers (node/versions.py), tombstones included, so this record is also
    the node's replica of the client's state in a cluster."""

    __slots__ = (
        "cid", "addr", "home", "cver", "local", "subs", "live", "last_seen", "mailbox", "fire",
        "dirty", "last_batch", "last_results", "cancelled", "changed", "counted",
    )  # fmt: skip

    def __init__(self, cid: Any, addr: Addr, home: str, now: float) -> None:
        self.cid = cid
        self.addr = addr
        self.home = home  # the node this client talks to (liveness is its job)
        self.cver = 0  # version of the (addr, home) register
        self.local = False  # home is this node: PING/timeout handled here
        self.subs: dict[tuple[str, str | None], int] = {}  # -> version (tombstones too)
        self.live = 0  # subscriptions present (not tombstones)
        self.last_seen = now
        self.mailbox: Mailbox | None = None
        self.fire: list[bytes] = []
        self.dirty = False
        self.last_batch: tuple[int, int] | None = None  # (client session, batch id)
        self.last_results: list[int] = []
        # Cancellations the client has not confirmed yet (by UNSUB or SUB);
        # repeated in every PONG so a lost CANCEL datagram cannot hide one.
        self.cancelled: dict[tuple[str, str | None], str] = {}
        self.changed: set[tuple[str, str | None]] | None = None  # not yet replicated
        self.counted: str | None = None  # source host this record counts against (max_per_host)

    def modes(self) -> dict[tuple[str, str | None], int]:
        """The subscriptions in force, with their delivery modes."""
        return {tk: v & versions.RELIABLE for tk, v in self.subs.items() if v & versions.PRESENT}


class BrokerCore:
    def __init__(
        self,
        config: NodeConfig,
        secret: bytes,
        rng: random.Random,
        incarnation: int,
        members: list[list[Any]] | None = None,
        node_idx: int = 0,
        wall_offset: float = 0.0,
        replicating: bool = False,
        tombstone_horizon: float = math.inf,
    ) -> None:
        self.cfg = config
        self.node_id = config.id
        self.node_idx = node_idx
        self.wall_offset = wall_offset  # core time + offset = Unix time (HLC, cookies)
        self.cookies = CookieJar(secret, config.cookie_lifetime)
        self.rng = rng
        self.hlc = versions.HybridClock()
        # Stream ids grow within an incarnation and across restarts (the shell
        # passes wall-clock milliseconds), so a client can ignore stale streams.
        self._next_stream = incarnation << 16
        self.members = members or [[config.id, *config.client_addr]]
        self.index = SubscriptionIndex()
        self.clients: dict[Any, ClientState] = {}
        self.producers: dict[bytes, list[Any]] = {}  # pid -> [acked_seq, last_seen, host]
        self._per_host: Counter[str] = Counter()  # producers + binary clients per source IP
        self.text_leases: dict[tuple[Addr, str], float] = {}
        self.text_subs = 0
        self.metrics: Counter[str] = Counter()
        self.replicating = replicating
        self.tombstone_horizon = tombstone_horizon
        self.digest = [0] * DIGEST_BUCKETS
        # Registers changed (local writes and merges), ever: a snapshot is due
        # when this moved since the last one.
        self.changes = 0
        self._changed: list[ClientState] = []
        self._timers: list[tuple[float, int, Any]] = []
        self._text_ok: dict[str, bool] = {}
        self._text_nets = [ipaddress.ip_network(n) for n in config.text_networks]
        self._out: list[Action] = []
        self._dirty: list[ClientState] = []
        self._now = 0.0
        self._pubacks: dict[tuple[Addr, bytes], int] = {}
        self._max = config.max_datagram
        self._budget = config.max_datagram - wire.MSGS_HEADER_MAX
        self.params = {
            "max_datagram": config.max_datagram,
            "ping_interval": config.ping_interval,
            "subscriber_timeout": config.subscriber_timeout,
        }

    # ------------------------------------------------------------ entry points

    def handle_datagrams(self, datagrams: list[tuple[bytes, Addr]], now: float) -> list[Action]:
        """Process a batch of datagrams in arrival order; return what to send."""
        self._now = now
        m = self.metrics
        m["datagrams_in"] += len(datagrams)
        for data, addr in datagrams:
            m["bytes_in"] += len(data)
            if not data:
                m["dropped_empty"] += 1
                continue
            first = data[0]
            is_text = 0x41 <= first <= 0x5A or 0x61 <= first <= 0x7A
            try:
                if len(data) > self._max:
                    raise WireError(E.TOO_LARGE, f"datagram over max_datagram ({self._max} bytes)")
                if is_text:
                    self._on_text(data, addr, now)
                else:
                    self._on_binary(data, addr, now)
            except WireError as exc:
                self._error(addr, exc, len(data), is_text)
        return self._finish(now)

    def tick(self, now: float) -> list[Action]:
        """Fire every timer that is due: retransmissions, timeouts, expiries."""
        timers = self._timers
        self._now = now
        while timers and timers[0][0] <= now:
            at, kind, key = heapq.heappop(timers)
            if kind == _RTO:
                self._on_rto(key, at, now)
            elif kind == _LIVENESS:
                self._on_liveness(key, now)
            elif kind == _LEASE:
                self._on_lease(key, now)
            else:
                self._on_producer(key, now)
        return self._finish(now)

    def _finish(self, now: float) -> list[Action]:
        """End of an entry point: coalesced sends, then the changes to replicate."""
        self._flush(now)
        if self._changed:
            self._out.append(Replicate(self._take_changes()))
        out, self._out = self._out, []
        return out

    def next_deadline(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    # ------------------------------------------------------------ replies

    def _send(self, addr: Addr, data: bytes) -> None:
        self._out.append(Send(addr, data))

    def _log(self, level: str, event: str, **fields: Any) -> None:
        self._out.append(Log(level, event, fields))

    def _error(self, addr: Addr, exc: WireError, req_len: int, is_text: bool) -> None:
        """Reply with an error, within the amplification budget of the source."""
        self.metrics["errors"] += 1
        self.metrics[f"error_{exc.code.name.lower()}"] += 1
        trusted = self._text_allowed(addr[0])
        if is_text:
            if trusted:
                self._send(addr, encode_text_error(exc.code, exc.text)[: self._max])
            else:
                self.metrics["dropped_forbidden"] += 1
            return
        # Sources on the trusted text networks get every error; others only
        # what the anti-amplification budget allows.
        self._bounded(addr, wire.encode_error(exc.code, exc.text), math.inf if trusted else req_len)

    def _bounded(self, addr: Addr, data: bytes, req_len: float) -> None:
        """Send to an address that has not proven it receives: at most 3x in."""
        if len(data) <= AMPLIFICATION * req_len:
            self._send(addr, data)
        else:
            self.metrics["dropped_amplification"] += 1

    # ------------------------------------------------------------ text protocol

    def _text_allowed(self, host: str) -> bool:
        ok = self._text_ok.get(host)
        if ok is None:
            try:
                ip = ipaddress.ip_address(host)
                ok = any(ip in n for n in self._text_nets)
            except ValueError:
                ok = False
            if len(self._text_ok) > 10000:
                self._text_ok.clear()
            self._text_ok[host] = ok
        return ok

    def _on_text(self, data: bytes, addr: Addr, now: float) -> None:
        if not self._text_allowed(addr[0]):
            raise WireError(E.FORBIDDEN, "text protocol not allowed from this network")
        verb, topic, body = parse_untrusted_text(data)
        wire.check_topic(topic)
        if verb == "PUB":
            payload = body.encode()
            if len(payload) + len(topic) + wire.MSGS_HEADER_MAX + 16 > self._max:
                raise WireError(E.TOO_LARGE, "body too large to be delivered in one datagram")
            self.metrics["published"] += 1
            self._publish(topic, None, None, payload, None)
            return
        tk = (topic, None)
        c = self.clients.get(addr)
        if verb == "SUB":
            if c is None or not c.subs.get(tk, 0) & versions.PRESENT:
                if self.text_subs >= self.cfg.max_text_subscribers:
                    raise WireError(E.OVERLOADED, "too many text subscriptions on this node")
                if c is None:
                    c = self._new_client(addr, addr, now)
                self._write(c, tk, True, Mode.FIRE, now)
                self._log("debug", "text_subscribe", addr=_fmt(addr), topic=topic)
            lease = self.cfg.text_sub_lease
            if lease > 0:
                key = (addr, topic)
                if key not in self.text_leases:
                    self._timer(now + lease, _LEASE, key)
                self.text_leases[key] = now + lease
        elif c is not None and c.subs.get(tk, 0) & versions.PRESENT:  # UNSUB
            self._write(c, tk, False, Mode.FIRE, now)
            self.text_leases.pop((addr, topic), None)
            self._log("debug", "text_unsubscribe", addr=_fmt(addr), topic=topic)

    def _on_lease(self, key: tuple[Addr, str], now: float) -> None:
        until = self.text_leases.get(key)
        if until is None:
            return
        if until > now:
            self._timer(until, _LEASE, key)
            return
        del self.text_leases[key]
        c = self.clients.get(key[0])
        if c is not None and c.subs.get((key[1], None), 0) & versions.PRESENT:
            self._write(c, (key[1], None), False, Mode.FIRE, now)
            self._log("info", "text_lease_expired", addr=_fmt(key[0]), topic=key[1])

    # ------------------------------------------------------------ binary protocol

    def _on_binary(self, data: bytes, addr: Addr, now: float) -> None:
        f = wire.decode_untrusted_frame(data, self._max)
        ftype = f[0]
        wall = now + self.wall_offset
        if ftype is T.HELLO:
            cookie = self.cookies.issue(addr, f[1], wall)
            welcome = wire.encode_welcome(self.node_id, cookie, self.params, self.members)
            self._bounded(addr, welcome, len(data))
            return
        if ftype not in (T.PUB, T.ACK, T.CMDS, T.PING, T.STATUS):
            raise WireError(E.UNKNOWN_TYPE, f"{ftype.name} is not sent to nodes")
        cid, cookie = f[1], f[2]
        if not self.cookies.check(addr, cid, cookie, wall):
            raise WireError(E.BAD_COOKIE, "cookie invalid or expired for this address; send HELLO")
        c = self.clients.get(cid)
        if c is not None:
            c.last_seen = now
            if ftype is T.CMDS or ftype is T.PING:
                # The client talks to this node now: it is this node's to watch.
                self._adopt(c, addr, now)
        if ftype is T.PUB:
            self._on_pub(addr, f, now)
        elif ftype is T.ACK:
            if c is not None:
                self._on_ack(c, f[3], f[4], f[5], now)
        elif ftype is T.CMDS:
            self._on_cmds(c, cid, addr, f[3], f[4], f[5], now)
        elif ftype is T.PING:
            fresh = self.cookies.is_fresh(addr, cid, cookie, wall)
            new_cookie = cookie if fresh else self.cookies.issue(addr, cid, wall)
            known = c is not None and c.live > 0
            cancels = [[t, k, r] for (t, k), r in c.cancelled.items()] if c else []
            self._send(addr, wire.encode_pong(f[3], known, new_cookie, cancels[:64]))
        else:
            self._out.append(StatusQuery(addr, self.status()))

    def _adopt(self, c: ClientState, addr: Addr, now: float) -> None:
        """Make this node the client's home (and note its address) if it is not yet."""
        if c.local and c.addr == addr:
            return
        if c.addr != addr:
            self._log("info", "client_moved", client=c.cid.hex(), old=_fmt(c.addr), new=_fmt(addr))
        elif not c.local:
            self._log("info", "client_adopted", client=c.cid.hex(), previous_home=c.home)
        c.addr = addr
        if not c.local:
            c.local = True
            self._timer(now + self.cfg.subscriber_timeout, _LIVENESS, c.cid)
        c.home = self.node_id
        self._set_cver(c, self._version(now, True, 0))
        self._mark_changed(c, None)

    def _on_pub(self, addr: Addr, f: tuple[Any, ...], now: float) -> None:
        _, _, _, pid, first, floor, reliable, msgs = f
        st = self.producers.get(pid)
        if st is None:
            self._admit(addr[0], len(self.producers), self.cfg.max_producers, "producers")
            st = self.producers[pid] = [0, now, addr[0]]
            self._timer(now + self.cfg.producer_timeout, _PRODUCER, pid)
        st[1] = now
        acked = int(st[0])
        if floor - 1 > acked:
            acked = floor - 1
        last = first + len(msgs) - 1
        if reliable and first > acked + 1:
            # An earlier batch is missing: keep FIFO by refusing this one; the
            # producer resends from the acknowledged point (go-back-N).
            self.metrics["pub_out_of_order"] += 1
            skip = len(msgs)
        else:
            skip = acked + 1 - first if acked >= first else 0
            if last > acked:
                acked = last
        st[0] = acked
        self.metrics["pub_duplicates"] += skip
        self.metrics["published"] += len(msgs) - skip
        publish = self._publish
        if reliable:
            pack = wire.pack_delivery
            seq = first + skip
            for m in msgs[skip:]:
                topic, key, tags, payload = m[0], m[1], m[2], m[3]
                publish(topic, key, tags, payload, pack(topic, key, tags, payload, pid, seq))
                seq += 1
            self._pubacks[(addr, pid)] = acked
        else:
            pack4 = wire.pack_message
            for m in msgs[skip:]:
                topic, key, tags, payload = m[0], m[1], m[2], m[3]
                publish(topic, key, tags, payload, pack4(topic, key, tags, payload))

    def _publish(
        self,
        topic: str,
        key: str | None,
        tags: dict[str, str] | None,
        payload: bytes,
        packed: bytes | None,
    ) -> None:
        subs = self.index.match(topic, key)
        if not subs:
            return
        clients = self.clients
        text_msg = None
        full: list[ClientState] | None = None
        for who, mode in subs.items():
            if who.__class__ is bytes:
                c = clients[who]
                if packed is None:
                    packed = wire.pack_message(topic, key, tags, payload)
                if mode:
                    mb = c.mailbox
                    if mb is None or not mb.push(packed):
                        # cancelling changes ``subs``: do it after the loop
                        full = [c] if full is None else [*full, c]
                        continue
                else:
                    c.fire.append(packed)
                if not c.dirty:
                    c.dirty = True
                    self._dirty.append(c)
            else:
                if text_msg is None:
                    text_msg = encode_text_msg(topic, payload)
                self._out.append(Send(who, text_msg))
                self.metrics["delivered"] += 1
        if full is not None:
            for c in full:
                if c.mailbox is not None:
                    self._overflow(c)

    def _overflow(self, c: ClientState) -> None:
        """Mailbox full: cancel every reliable subscription of this client."""
        self.metrics["cancelled_out_of_capacity"] += 1
        now = self._now
        for tk, v in list(c.subs.items()):
            if v & versions.PRESENT and v & versions.RELIABLE:
                self._write(c, tk, False, Mode.RELIABLE, now, REASON_OUT_OF_CAPACITY)
                c.cancelled[tk] = Reason.OUT_OF_CAPACITY
                self._send(c.addr, wire.encode_cancel(tk[0], tk[1], Reason.OUT_OF_CAPACITY))
        c.mailbox = None
        self._log("warning", "out_of_capacity", client=c.cid.hex(), addr=_fmt(c.addr))

    def _on_cmds(
        self,
        c: ClientState | None,
        cid: bytes,
        addr: Addr,
        session: int,
        batch: int,
        cmds: list[tuple[int, str, str | None, int]],
        now: float,
    ) -> None:
        if c is not None and c.last_batch is not None and session < c.last_batch[0]:
            self.metrics["stale_session"] += 1  # a late datagram of a session the client has left
            return
        if c is not None and c.last_batch is not None and session > c.last_batch[0]:
            # The same client id from a new client session (a restarted
            # process): what the old one subscribed is not this one's.
            self._log("info", "client_restarted", client=cid.hex())
            for tk, v in list(c.subs.items()):
                if v & versions.PRESENT:
                    self._write(c, tk, False, v & versions.RELIABLE, now)
            c.mailbox = None
            c.cancelled.clear()
            c.last_batch = None
        if c is not None and c.last_batch is not None and batch <= c.last_batch[1]:
            # A retry of a batch already applied: applying it again could undo
            # a later command, so only repeat the answer.
            self._send(addr, wire.encode_cmdack(session, batch, c.last_results))
            return
        if c is None:
            self._admit(addr[0], len(self.clients), self.cfg.max_clients, "clients")
            c = self._new_client(cid, addr, now)
            c.counted = addr[0]
            self._log("info", "client_new", client=cid.hex(), addr=_fmt(addr))
        results = []
        for op, topic, key, mode in cmds:
            results.append(self._apply(c, op, topic, key, mode, now))
        c.last_batch = (session, batch)
        c.last_results = results
        self._send(addr, wire.encode_cmdack(session, batch, results))

    def _new_client(self, cid: Any, addr: Addr, now: float) -> ClientState:
        """A client that talks to this node (its home)."""
        c = self.clients[cid] = ClientState(cid, addr, self.node_id, now)
        c.local = True
        self._set_cver(c, self._version(now, True, 0))
        if cid.__class__ is bytes:
            self._timer(now + self.cfg.subscriber_timeout, _LIVENESS, cid)
        self._mark_changed(c, None)
        return c

    def _apply(self, c: ClientState, op: int, topic: str, key: str | None, mode: int, now: float) -> int:
        tk = (topic, key)
        c.cancelled.pop(tk, None)
        present = bool(c.subs.get(tk, 0) & versions.PRESENT)
        if op == Op.UNSUB:
            if present:
                self._write(c, tk, False, mode, now)
                self._log("debug", "unsubscribe", client=c.cid.hex(), topic=topic, key=key)
            return E.OK
        if not present and c.live >= self.cfg.max_subscriptions_per_client:
            return E.OVERLOADED
        self._write(c, tk, True, mode, now)
        self._log("debug", "subscribe", client=c.cid.hex(), topic=topic, key=key, mode=mode)
        return E.OK

    # ------------------------------------------------------------ replicated state

    def _version(self, now: float, present: bool, mode: int, reason: int = 0) -> int:
        hlc = self.hlc.now(now + self.wall_offset)
        return versions.make(hlc, self.node_idx, present, mode) | (reason << 2)

    def _write(
        self, c: ClientState, tk: tuple[str, str | None], present: bool, mode: int, now: float,
        reason: int = 0,
    ) -> None:  # fmt: skip
        """A local change of one subscription: a new version, applied and queued."""
        self._set(c, tk, self._version(now, present, mode, reason))
        self._mark_changed(c, tk)

    def _set_cver(self, c: ClientState, cver: int) -> None:
        """Install a version of the client's (address, home) register.

        The register counts in the digest only while the client has
        subscription registers: an empty record is local bookkeeping that one
        replica may already have collected and another (its home) keeps.
        """
        if self.replicating and c.subs:
            self._digest_client(c)
            c.cver = cver
            self._digest_client(c)
        else:
            c.cver = cver

    def _digest_client(self, c: ClientState) -> None:
        """Toggle the client register's share in its bucket digest."""
        b, h = _key_hash(c.cid, None)
        self.digest[b] ^= _mix(h, c.cver)

    def _mark_changed(self, c: ClientState, tk: tuple[str, str | None] | None) -> None:
        if not self.replicating:
            return
        if c.changed is None:
            c.changed = set()
            self._changed.append(c)
        if tk is not None:
            c.changed.add(tk)

    def _set(self, c: ClientState, tk: tuple[str, str | None], version: int) -> None:
        """Install a version (newer than what we hold) and update the index."""
        self.changes += 1
        old = c.subs.get(tk, 0)
        topic, key = tk
        if version & versions.PRESENT:
            mode = version & versions.RELIABLE
            topic = self.index.add(topic, key, c.cid, mode)
            tk = (topic, key)
            if mode and c.mailbox is None and c.cid.__class__ is bytes:
                c.mailbox = Mailbox(
                    self._new_stream(), self.cfg.mailbox_capacity,
                    self.cfg.retransmit_timeout, self.cfg.retransmit_max, self.cfg.mailbox_max_bytes,
                )  # fmt: skip
            if not old & versions.PRESENT:
                c.live += 1
                if c.cid.__class__ is not bytes:
                    self.text_subs += 1
        elif old & versions.PRESENT:
            self.index.remove(topic, key, c.cid)
            c.live -= 1
            if c.cid.__class__ is not bytes:
                self.text_subs -= 1
                if c.live == 0:
                    c.local = False  # nothing to watch any more: GC may take the record
        if self.replicating and not c.subs:
            self._digest_client(c)  # the first register: the client's own counts now
        if self.replicating or version & versions.PRESENT:
            c.subs[tk] = version
        else:
            c.subs.pop(tk, None)  # a single node needs no tombstones
            if not c.subs and c.cid.__class__ is not bytes:
                self.clients.pop(c.cid, None)  # a text address with nothing left
        live_reliable = versions.PRESENT | versions.RELIABLE
        if (
            c.mailbox is not None
            and old & live_reliable == live_reliable
            and version & live_reliable != live_reliable
            and not any(v & live_reliable == live_reliable for v in c.subs.values())
        ):
            # No reliable subscription left: forget the stream, so that the
            # next one starts a fresh stream at sequence 1.
            c.mailbox = None
        if self.replicating:
            b, h = _key_hash(c.cid, tk)
            self.digest[b] ^= _mix(h, old) ^ _mix(h, version)

    def _take_changes(self) -> list[list[Any]]:
        """Replication entries for every local change since the last call."""
        out = []
        for c in self._changed:
            tks = c.changed or ()
            c.changed = None
            out.append(self._entry(c, [(tk, c.subs[tk]) for tk in tks]))
        self._changed.clear()
        return out

    def _entry(self, c: ClientState, subs: Any) -> list[Any]:
        """``[who, cver, host, port, home, [[topic, key, version], ...]]``."""
        who = c.cid if c.cid.__class__ is bytes else list(c.cid)
        return [who, c.cver, c.addr[0], c.addr[1], c.home, [[t, k, v] for (t, k), v in subs]]

    def merge(self, entries: list[Any], now: float) -> list[Action]:
        """Apply replicated entries (already validated); ``changes`` counts the
        registers that moved. Returns what that causes (re-asserted writes to
        replicate, logs).

        Last writer wins per register, so any order, repetition or grouping of
        the same entries leaves the same state.
        """
        self._now = now
        clients = self.clients
        observe = self.hlc.observe
        wall = now + self.wall_offset
        # A version from further ahead than MAX_CLOCK_SKEW is refused: it would
        # drag every clock forward (and soon overflow 64 bits).
        too_new = versions.upper_bound(wall + MAX_CLOCK_SKEW)
        # Tombstones older than the horizon are gone here; one arriving from a
        # replica that has not collected it yet must not come back to life.
        expired = versions.upper_bound(wall - self.tombstone_horizon) if self.tombstone_horizon < math.inf else 0
        for who, cver, host, port, home, subs in entries:
            if cver > too_new or any(v > too_new for _, _, v in subs):
                self.metrics["merge_refused_future"] += 1
                continue
            c = clients.get(who)
            if c is None:
                if cver < expired and all(not v & versions.PRESENT and v < expired for _, _, v in subs):
                    continue
                # (an entry of recent tombstones only is kept: forgetting it
                # would let an older "subscribed" version win later)
                c = clients[who] = ClientState(who, (host, port), home, now)
            if cver > c.cver:
                observe(cver)
                self._set_cver(c, cver)
                c.addr = (host, port)
                c.home = home
                was_local = c.local
                c.local = home == self.node_id
                if c.local and not was_local and who.__class__ is bytes:
                    c.last_seen = now
                    self._timer(now + self.cfg.subscriber_timeout, _LIVENESS, who)
            for topic, key, v in subs:
                tk = (topic, key)
                old = c.subs.get(tk, 0)
                if v > old and (v & versions.PRESENT or v >= expired):
                    observe(v)
                    self._set(c, tk, v)
                    if c.local and not v & versions.PRESENT:
                        reason = (v >> 2) & 3
                        if reason == REASON_OUT_OF_CAPACITY:
                            c.cancelled[tk] = Reason.OUT_OF_CAPACITY  # repeat it in PONG
                        elif (
                            reason == REASON_TIMED_OUT and old & versions.PRESENT
                            and now - c.last_seen < self.cfg.subscriber_timeout
                        ):
                            # Another member gave this client up for lost, but it
                            # talks to us: its subscription stands (a newer write).
                            self._write(c, tk, True, old & versions.RELIABLE, now)
                            self.metrics["reasserted"] += 1
        return self._finish(now)

    def dump(self, buckets: set[int] | None = None) -> Any:
        """Every client's entry (or only the registers in ``buckets``)."""
        for c in list(self.clients.values()):
            if buckets is None:
                yield self._entry(c, c.subs.items())
                continue
            subs = [(tk, v) for tk, v in c.subs.items() if _key_hash(c.cid, tk)[0] in buckets]
            if subs or _key_hash(c.cid, None)[0] in buckets:
                yield self._entry(c, subs)

    def expire_home(self, home: str, now: float) -> list[Action]:
        """Tombstone the subscriptions of binary clients whose home node is gone.

        Their clients either moved to another node already (and re-subscribed
        there, which changed ``home``) or are gone too.
        """
        n = 0
        for c in list(self.clients.values()):
            if c.home == home and c.cid.__class__ is bytes and c.live:
                for tk, v in list(c.subs.items()):
                    if v & versions.PRESENT:
                        self._write(c, tk, False, v & versions.RELIABLE, now, REASON_TIMED_OUT)
                        n += 1
        if n:
            self._log("info", "expired_home", home=home, subscriptions=n)
        return self._finish(now)

    def collect_tombstones(self, now: float) -> list[Action]:
        """Forget tombstones older than ``tombstone_horizon``, and empty records."""
        if self.tombstone_horizon == math.inf:
            return []
        limit_ms = int((now + self.wall_offset - self.tombstone_horizon) * 1000)
        gone = 0
        for cid, c in list(self.clients.items()):
            for tk, v in list(c.subs.items()):
                if not v & versions.PRESENT and versions.millis_of(v) < limit_ms:
                    b, h = _key_hash(cid, tk)
                    self.digest[b] ^= _mix(h, v)
                    del c.subs[tk]
                    gone += 1
                    if not c.subs:
                        self._digest_client(c)  # no registers left: its own stops counting
            if not c.subs and not c.local and versions.millis_of(c.cver) < limit_ms:
                del self.clients[cid]
                self._forget_counted(c)
        if gone:
            self.metrics["tombstones_collected"] += gone
            self._log("info", "tombstones_collected", count=gone)
        return self._finish(now)

    def _new_stream(self) -> int:
        self._next_stream += 1
        return self._next_stream

    def _on_ack(
        self, c: ClientState, stream: int, max_seq: int, sack: list[tuple[int, int]], now: float
    ) -> None:
        mb = c.mailbox
        if mb is None or stream != mb.stream_id:
            self.metrics["ack_stale"] += 1
            return
        mb.on_ack(max_seq, sack, now)
        self._arm(c, mb)
        if sack:
            self._resend(c, mb, mb.fast_retransmit(now))
        if len(mb) > mb.sent - mb.acked and not c.dirty:
            c.dirty = True
            self._dirty.append(c)

    def _arm(self, c: ClientState, mb: Mailbox) -> None:
        """Keep one timer entry per mailbox; it re-arms itself when it fires early."""
        if mb.rto_at is not None and not mb.armed:
            mb.armed = True
            self._timer(mb.rto_at, _RTO, c.cid)

    def _on_rto(self, cid: bytes, at: float, now: float) -> None:
        c = self.clients.get(cid)
        if c is None or c.mailbox is None:
            return
        mb = c.mailbox
        mb.armed = False
        if mb.rto_at is None:
            return
        if mb.rto_at <= now:
            self._resend(c, mb, mb.on_timeout(now))
        self._arm(c, mb)

    def _resend(self, c: ClientState, mb: Mailbox, runs: list[tuple[int, list[bytes]]]) -> None:
        for first, entries in runs:
            self.metrics["retransmitted"] += len(entries)
            self._emit(c.addr, mb.stream_id, first, entries)

    def _on_liveness(self, cid: bytes, now: float) -> None:
        c = self.clients.get(cid)
        if c is None or not c.local:
            return
        expires = c.last_seen + self.cfg.subscriber_timeout
        if expires > now:
            self._timer(expires, _LIVENESS, cid)
            return
        self.metrics["clients_timed_out"] += 1
        self._log("info", "client_timed_out", client=cid.hex(), addr=_fmt(c.addr), subs=c.live)
        self.drop_client(c, now)

    def drop_client(self, c: ClientState, now: float) -> None:
        """The client is gone: end its subscriptions everywhere and free its state."""
        for tk, v in list(c.subs.items()):
            if v & versions.PRESENT:
                self._write(c, tk, False, v & versions.RELIABLE, now, REASON_TIMED_OUT)
        c.mailbox = None
        c.fire = []
        c.local = False
        if not self.replicating:
            del self.clients[c.cid]
            self._forget_counted(c)

    def _admit(self, host: str, count: int, limit: int, what: str) -> None:
        """Room for one more client or producer, node-wide and from ``host``?
        Counts it against the host (released by _forget_host)."""
        if count >= limit:
            raise WireError(E.OVERLOADED, f"too many {what} on this node")
        if self._per_host[host] >= self.cfg.max_per_host:
            raise WireError(E.OVERLOADED, "too many producers and clients from this host")
        self._per_host[host] += 1

    def _forget_counted(self, c: ClientState) -> None:
        if c.counted is not None:
            self._forget_host(c.counted)
            c.counted = None

    def _forget_host(self, host: str) -> None:
        n = self._per_host[host] - 1
        if n > 0:
            self._per_host[host] = n
        else:
            del self._per_host[host]

    def _on_producer(self, pid: bytes, now: float) -> None:
        st = self.producers.get(pid)
        if st is None:
            return
        expires = st[1] + self.cfg.producer_timeout
        if expires > now:
            self._timer(expires, _PRODUCER, pid)
        else:
            del self.producers[pid]
            self._forget_host(st[2])

    def _timer(self, at: float, kind: int, key: Any) -> None:
        heapq.heappush(self._timers, (at, kind, key))

    # ------------------------------------------------------------ output

    def _flush(self, now: float) -> None:
        """Send everything queued by this batch, coalesced per destination."""
        for (addr, pid), acked in self._pubacks.items():
            self._send(addr, wire.encode_puback(pid, acked))
        self._pubacks.clear()
        window = self.cfg.send_window
        for c in self._dirty:
            c.dirty = False
            if c.fire:
                self._emit(c.addr, 0, 0, c.fire)
                c.fire = []
            mb = c.mailbox
            if mb is not None:
                first, entries = mb.take_new(window, now)
                if entries:
                    self._emit(c.addr, mb.stream_id, first, entries)
                    self._arm(c, mb)
        self._dirty.clear()

    def _emit(self, addr: Addr, stream: int, first: int, entries: list[bytes]) -> None:
        """MSGS datagrams for a run of messages, each up to max_datagram."""
        budget = self._budget
        out = self._out
        encode = wire.encode_msgs
        start = 0
        size = 0
        seq = first
        for i, e in enumerate(entries):
            n = len(e)
            if size + n > budget and i > start:
                out.append(Send(addr, encode(stream, seq, entries[start:i])))
                seq += (i - start) if stream else 0
                start, size = i, 0
            size += n
        out.append(Send(addr, encode(stream, seq, entries[start:])))
        self.metrics["delivered"] += len(entries)

    # ------------------------------------------------------------ inspection

    def state_digest(self) -> tuple[Any, ...]:
        """Everything a datagram could change, for tests that check it did not."""
        return (
            sorted(
                (t, repr(k), repr(w), m)
                for t, keys in self.index.topics.items()
                for k, subs in keys.items()
                for w, m in subs.items()
            ),
            sorted(
                (repr(cid), repr(c.addr), c.home, sorted(c.subs.items(), key=repr))
                for cid, c in self.clients.items()
            ),
            sorted(self.producers),
            self.text_subs,
        )

    def status(self) -> dict[str, Any]:
        return {
            "node": self.node_id,
            "clients": sum(1 for c in self.clients.values() if c.live),
            "subscriptions": self.index.count,
            "topics": len(self.index.topics),
            "producers": len(self.producers),
            "metrics": dict(self.metrics),
        }


def _fmt(addr: Addr) -> str:
    return f"{addr[0]}:{addr[1]}"
