"""The broker core: datagrams and time in, datagrams and log events out.

Sans-IO (docs/architecture.md): no sockets, clocks, trio or global randomness here. The
shell (``node/server.py``) drains every datagram that is ready, hands the whole
batch to :meth:`BrokerCore.handle_datagrams` and sends what comes back; it calls
:meth:`BrokerCore.tick` when :meth:`BrokerCore.next_deadline` passes. Output is
coalesced per destination: all messages for one subscriber produced by one
batch leave in as few MSGS datagrams as the datagram size allows.

Bad input never raises out of here and never changes state: every decoder
error becomes an ERROR reply (or a counted drop where a reply could amplify
traffic towards an unvalidated address).

This module holds the entry points and the dispatch of datagrams and timers.
The machinery is a stack of layers, one module each, every layer using only
those below it (one class at run time, so the hot path pays no extra calls):

    node/base.py        CoreBase: settings, metrics, actions being built, timers, error replies
    node/registers.py   Registers: replicated registers, index, digest, merge, dump, expiry
    node/delivery.py    Delivery: fan-out, mailboxes, coalesced output, ACK and RTO repair
    node/producers.py   Producers: PUB dedup by producer id and sequence, PUBACK
    node/textproto.py   TextProtocol: FASTPUSS PUB/SUB/UNSUB
    node/sessions.py    Sessions: command batches within client sessions, PONG, timeouts

Every entry point returns its actions; the last one is a ``Replicate`` when
replicated registers changed.
"""

from __future__ import annotations

import heapq
import math
import random
from typing import Any

from roost.client import decoding, wire
from roost.client.wire import ErrorCode, FrameType, WireError
from roost.node.actions import (
    Action,
    Confirm,
    DurableCommit,
    DurableGet,
    DurablePut,
    Forward,
    Log,
    Relay,
    Replicate,
    Send,
    StatusQuery,
)  # fmt: skip
from roost.node.admission import Admission
from roost.node.base import AMPLIFICATION, TIMER_LEASE, TIMER_LIVENESS, TIMER_RTO
from roost.node.config import NodeConfig
from roost.node.cookies import Addr, CookieJar
from roost.node.producers import Producers
from roost.node.registers import DIGEST_BUCKETS
from roost.node.sessions import Sessions
from roost.node.textproto import TextProtocol

__all__ = [
    "DIGEST_BUCKETS",
    "Action",
    "BrokerCore",
    "Confirm",
    "DurableCommit",
    "DurableGet",
    "DurablePut",
    "Forward",
    "Log",
    "Relay",
    "Replicate",
    "Send",
    "StatusQuery",
]

_CLIENT_FRAMES = (
    FrameType.PUB,
    FrameType.PUBRUN,
    FrameType.ACK,
    FrameType.CMDS,
    FrameType.PING,
    FrameType.STATUS,
    FrameType.MAP,
    FrameType.PUT,
    FrameType.GET,
    FrameType.COMMIT,
    FrameType.BYE,
)


class BrokerCore(Sessions, TextProtocol, Producers):
    def __init__(
        self,
        config: NodeConfig,
        rng: random.Random,
        incarnation: int,
        members: list[list[Any]] | None = None,
        node_idx: int = 0,
        wall_offset: float = 0.0,
        replicating: bool = False,
        tombstone_horizon: float = math.inf,
    ) -> None:
        """``rng`` is the core's only source of randomness (docs/architecture.md: passed
        in, never global): the cookie keys are drawn from it, so a shell passes
        ``random.SystemRandom()``. ``incarnation`` (the shell passes wall-clock
        milliseconds) makes stream ids grow across restarts."""
        super().__init__(config, node_idx, wall_offset, replicating, tombstone_horizon, incarnation)
        self.cookies = CookieJar(rng, config.cookie_lifetime)
        self.members = members or [[config.id, *config.client_addr]]
        self.producers = {}
        self.producer_hosts = {}
        self.producer_share = Admission(config.max_producers)
        self._producer_timers = set()
        self.text_leases = {}
        self.params: dict[str, Any] = {
            "max_datagram": config.max_datagram,
            "max_payload": config.max_payload,
            "send_window": config.send_window,
            "ping_interval": config.ping_interval,
            "subscriber_timeout": config.subscriber_timeout,
            "runs": 1,  # (this node takes PUBRUN: a client sends it only to a node that says so)
        }
        self._lean_params = self.params  # WELCOME params without the map (when it would not fit)

    def set_cluster_map(self, cmap: list[Any] | None, epoch: int) -> None:
        """Partitioned mode: the cluster map the member core installed, in its wire form
        (client/clustermap.py, ``encode``; the node package does not interpret it), and its
        epoch. WELCOME carries it from now on (or, where it would break the anti-amplification
        budget, only its epoch, and the client asks with MAP); a binary client whose PUB or SUB
        reaches us for a partition we are not primary of gets it in a REDIRECT, once per epoch."""
        base = {k: v for k, v in self.params.items() if k not in ("map", "map_epoch")}
        if cmap is None:
            self.params = self._lean_params = base
            self.map_epoch, self.redirect_frame = 0, None
            return
        self._lean_params = {**base, "map_epoch": epoch}
        self.params = {**self._lean_params, "map": cmap}
        self.map_epoch = epoch
        self.redirect_frame = wire.encode_redirect(self.node_id, cmap)

    # ------------------------------------------------------------ entry points

    def handle_datagrams(self, datagrams: list[tuple[bytes, Addr]], now: float) -> list[Action]:
        """Process a batch of datagrams in arrival order; return what to send."""
        self._now = now
        m = self.metrics
        m["datagrams_in"] += len(datagrams)
        rated = self.cfg.max_host_bytes_per_second > 0
        for data, addr in datagrams:
            m["bytes_in"] += len(data)
            if not data:
                m["dropped_empty"] += 1
                continue
            if rated and self._over_rate(addr[0], len(data), now):
                continue
            first = data[0]
            is_text = 0x41 <= first <= 0x5A or 0x61 <= first <= 0x7A
            try:
                if len(data) > self._max:
                    raise WireError(ErrorCode.TOO_LARGE, f"datagram over max_datagram ({self._max} bytes)")
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
            _, kind, key = heapq.heappop(timers)
            if kind == TIMER_RTO:
                self._on_rto(key, now)
            elif kind == TIMER_LIVENESS:
                self._on_liveness(key, now)
            elif kind == TIMER_LEASE:
                self._on_lease(key, now)
            else:
                self._on_producer(key, now)
        return self._finish(now)

    def next_deadline(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def merge(self, entries: list[Any], now: float) -> list[Action]:
        """Apply replicated entries (already validated); ``changes`` counts the
        registers that moved. Returns what that causes (re-asserted writes to
        replicate, logs).

        Last writer wins per register, so any order, repetition or grouping of
        the same entries leaves the same state.
        """
        self._now = now
        self._merge(entries, now)
        return self._finish(now)

    def forwarded(self, msgs: list[Any], now: float, ours: bool = False) -> tuple[list[Action], list[int]]:
        """Partitioned mode: messages another member forwarded to us (validated by
        the caller), or (``ours``) our own forwards to route again by a new map.
        Also returns the indexes of the messages refused (not ours to deliver)."""
        self._now = now
        refused = self._deliver_forwarded(msgs, ours)
        return self._finish(now), refused

    def settle_forwards(self, msgs: list[Any], now: float) -> list[Action]:
        """Partitioned mode: our forwarded messages that a primary took into its mailboxes (or
        that we gave up: no owner, a full queue); their PUBACKs may go out now."""
        self._now = now
        for m in msgs:
            if m[4] is not None:
                self._settle(m[4], m[5])
        return self._finish(now)

    def expire_home(self, home: str, now: float) -> list[Action]:
        """Tombstone the subscriptions of binary clients whose home node ``home`` is gone."""
        self._now = now
        self._expire_home(home, now)
        return self._finish(now)

    def collect_tombstones(self, now: float) -> list[Action]:
        """Forget tombstones older than ``tombstone_horizon``, and empty records."""
        self._now = now
        self._collect_tombstones(now)
        return self._finish(now)

    def _finish(self, now: float) -> list[Action]:
        """End of an entry point: coalesced sends, then the changes to replicate."""
        self._flush(now)
        if self._forwards:
            self._out.extend(Forward(m, msgs) for m, msgs in self._forwards.items())
            self._forwards = {}
        if self._relays:
            self._out.extend(Relay(m, sends) for m, sends in self._relays.items())
            self._relays = {}
        if self._changed:
            self._out.append(Replicate(self._take_changes()))
        out, self._out = self._out, []
        return out

    # ------------------------------------------------------------ dispatch

    def _on_binary(self, data: bytes, addr: Addr, now: float) -> None:
        f = decoding.decode_untrusted_frame(data, self._max)
        ftype = f[0]
        wall = now + self.wall_offset
        if ftype is FrameType.HELLO:
            cookie = self.cookies.issue(addr, f[1], wall)
            welcome = wire.encode_welcome(self.node_id, cookie, self.params, self.members)
            if len(welcome) > AMPLIFICATION * len(data) and self.params is not self._lean_params:
                self.metrics["welcome_without_map"] += 1  # (the client asks for it with MAP)
                welcome = wire.encode_welcome(self.node_id, cookie, self._lean_params, self.members)
            self._bounded(addr, welcome, len(data))
            return
        if ftype not in _CLIENT_FRAMES:
            raise WireError(ErrorCode.UNKNOWN_TYPE, f"{ftype.name} is not sent to nodes")
        cid, cookie = f[1], f[2]
        if not self.cookies.check(addr, cid, cookie, wall):
            raise WireError(ErrorCode.BAD_COOKIE, "cookie invalid or expired for this address; send HELLO")
        c = self.clients.get(cid)
        if ftype is FrameType.CMDS:
            self._on_cmds(c, cid, addr, f[3], f[4], f[5], now)  # (a stale session must not touch c)
            return
        if ftype is FrameType.BYE:
            self._on_bye(c, addr, f[3], now)
            return
        # A PING of a process the client id has since been restarted in (a lower session) is
        # answered, but is neither liveness nor a reason to move the client to its address.
        stale = ftype is FrameType.PING and c is not None and 0 < f[5] < c.session
        if ftype is FrameType.PING and c is not None and not stale:
            self._may_move(c, addr)  # (refused: no liveness either, so the record at its old address times out)
        if c is not None and not stale:
            c.last_seen = c.heard = now
        if ftype is FrameType.PUB:
            self._on_pub(addr, f, now, data)
        elif ftype is FrameType.PUBRUN:
            self._on_pubrun(addr, f, now)
        elif ftype is FrameType.ACK:
            if c is not None:
                self._on_ack(c, f[3], f[4], f[5], now)
        elif ftype is FrameType.PING:
            if stale:
                self.metrics["stale_pings"] += 1
            elif c is not None:
                self._adopt(c, addr, now, f[5])  # the client talks to this node now: it is ours to watch
            fresh = self.cookies.is_fresh(addr, cid, cookie, wall)
            self._on_ping(c, addr, f[3], cookie if fresh else self.cookies.issue(addr, cid, wall), f[4])
        elif ftype is FrameType.PUT:
            for m in f[7]:
                self._durable_partition(m[0], f[4])
            self._out.append(DurablePut(addr, f[3], f[4], f[5], f[6], [list(m) for m in f[7]]))
        elif ftype is FrameType.GET:
            self._durable_partition(f[5], f[6])
            self._out.append(DurableGet(addr, f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10]))
        elif ftype is FrameType.COMMIT:
            self._durable_partition(f[5], f[6])
            self._out.append(DurableCommit(addr, f[3], f[4], f[5], f[6], f[7]))
        elif ftype is FrameType.MAP:
            if self.redirect_frame is None:
                raise WireError(
                    ErrorCode.UNKNOWN_TYPE, "no cluster map: this node is not a member of a partitioned cluster"
                )
            self._send(addr, self.redirect_frame)
        else:
            self._out.append(StatusQuery(addr, self.status()))

    def _durable_partition(self, topic: str, p: int) -> None:
        """A durable request names ``topic`` in partition ``p``: refused unless this is a member
        of a partitioned cluster and ``p`` is the topic's partition."""
        own = self.own
        if own is None:
            raise WireError(ErrorCode.UNKNOWN_TYPE, "durable publishes need a member of a partitioned cluster")
        if p >= own.partitions:
            raise WireError(ErrorCode.MALFORMED, f"partition {p}: the cluster has {own.partitions} partitions")
        if own.partition(topic) != p:
            raise WireError(ErrorCode.MALFORMED, f"topic {topic!r} is not in partition {p}")

    # ------------------------------------------------------------ inspection

    def state_digest(self) -> tuple[Any, ...]:
        """Everything a datagram could change, for tests that check it did not."""
        return (
            sorted(
                (t, repr(k), repr(w), m)
                for t, keys in [*self.index.topics.items(), *((f, fs.keys) for f, fs in self.index.filters.items())]
                for k, subs in keys.items()
                for w, m in subs.items()
            ),
            sorted(
                (repr(cid), repr(c.addr), c.home, sorted(c.subs.items(), key=repr)) for cid, c in self.clients.items()
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
            "filters": len(self.index.filters),  # (wildcards, queries, queue groups: client/subjects.py)
            "producers": len(self.producers),
            "pid": self.pid,
            "monitor": self.cfg.monitor_addr or None,  # (roost status and top read it)
            "metrics": dict(self.metrics),
        }
