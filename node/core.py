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

This module holds the entry points, the dispatch of datagrams and timers, and what a
source may send and be sent (text networks, anti-amplification, host byte rates, error
replies). The machinery is a composition of components, plain classes that own their state,
each depending only on those built before it (none calls back into BrokerCore):

    node/outbox.py      Outbox: the actions being built, the timer heap, the entry point's time
    node/placement.py   Placement: partitioned mode's ownership, map epoch and REDIRECT frame
    node/delivery.py    Delivery: coalesced MSGS/PUBACK output, ACK and RTO repair, text credit
    node/queuegroups.py QueueGroups: filters and queue groups at fan-out, requeueing
    node/streams.py     Streams: a client's mailbox follows its reliable registers
    node/registers.py   Registers: replicated registers, index, digest, merge, dump, expiry
    node/fanout.py      Fanout: one message to every subscriber, out-of-capacity cancels
    node/forwarding.py  Forwarding: partitioned mode's messages to and from other primaries
    node/producers.py   Producers: PUB dedup by producer id and sequence, PUBACK
    node/textproto.py   TextProtocol: FASTPUSS PUB/SUB/UNSUB, text leases
    node/sessions.py    Sessions: command batches within client sessions, PONG, timeouts

"""

from __future__ import annotations

import heapq
import ipaddress
import math
import random
from collections import Counter
from typing import Any

from roost.client import decoding, wire
from roost.client import decoding as D
from roost.client.text import encode_text_error
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
    Trace,
)  # fmt: skip
from roost.node.admission import Admission
from roost.node.budgets import SubscriptionBudgets
from roost.node.clients import ClientState
from roost.node.config import NodeConfig
from roost.node.cookies import Addr, CookieJar
from roost.node.delivery import Delivery
from roost.node.fanout import Fanout
from roost.node.forwarding import Forwarding
from roost.node.outbox import AMPLIFICATION, TIMER_LEASE, TIMER_LIVENESS, TIMER_RTO, Outbox
from roost.node.ownership import Ownership
from roost.node.placement import Placement
from roost.node.producers import Producers, ProducerState
from roost.node.queuegroups import QueueGroups
from roost.node.registers import DIGEST_BUCKETS, Registers
from roost.node.sessions import Sessions
from roost.node.streams import Streams
from roost.node.subscriptions import SubscriptionIndex
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
    "Trace",
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


class BrokerCore:
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
        self.cfg = config
        self.node_id = config.id
        self.wall_offset = wall_offset  # core time + offset = Unix time (HLC, cookies)
        self.metrics: Counter[str] = Counter()
        self.admission = Admission(config.max_per_host, self.metrics)
        self.client_share = Admission(config.max_clients)  # binary client records alone, per host
        self.outbox = outbox = Outbox()
        self.place = place = Placement()
        m = self.metrics
        clients: dict[Any, ClientState] = {}
        index = SubscriptionIndex()
        self.delivery = Delivery(config, m, outbox, clients, incarnation)
        self.groups = QueueGroups(config, m, outbox, clients, index, self.delivery.dirty)
        self.streams = Streams(config, m, self.delivery, self.groups, incarnation)
        self.registers = Registers(config, m, outbox, place, clients, index, self.admission, self.client_share,
                                   self.delivery, self.streams, self.groups, node_idx, wall_offset, replicating,
                                   tombstone_horizon)  # fmt: skip
        self.fanout = Fanout(config, m, outbox, place, self.registers, self.groups, self.delivery)
        self.forwarding = Forwarding(config, m, outbox, place, self.fanout)
        self.producing = Producers(config, m, outbox, place, self.admission, self.delivery, self.fanout,
                                   self.forwarding)  # fmt: skip
        self.text = TextProtocol(config, m, outbox, place, self.registers, self.fanout, self.forwarding)
        self.sessions = Sessions(config, m, outbox, place, self.registers, self.streams, self.admission,
                                 self.client_share)  # fmt: skip
        self.cookies = CookieJar(rng, config.cookie_lifetime)
        self.members = members or [[config.id, *config.client_addr]]
        self.params: dict[str, Any] = {
            "max_datagram": config.max_datagram,
            "max_payload": config.max_payload,
            "send_window": config.send_window,
            "ping_interval": config.ping_interval,
            "subscriber_timeout": config.subscriber_timeout,
            "runs": 1,  # (this node takes PUBRUN: a client sends it only to a node that says so)
        }
        self._lean_params = self.params  # WELCOME params without the map (when it would not fit)
        # The process serving this core, set by the shell: STATUS tells it, so that a launcher
        # knows the process it started answers, and not another that holds the port.
        self.pid: int | None = None
        self._max = config.max_datagram
        self._text_ok: dict[str, bool] = {}
        self._text_nets = [ipaddress.ip_network(n) for n in config.text_networks]
        # Each source host's byte budget (max_host_bytes_per_second): the bytes it may still
        # send now, and when that was reckoned; two dicts of plain values, out of the
        # collector's sight.
        self._host_tokens: dict[str, float] = {}
        self._host_at: dict[str, float] = {}
        # Broken build "accept-any-cookie" (tests/test_fuzz.py): a wrong cookie is taken.
        self._any_cookie = "accept-any-cookie" in config.breaks

    # ------------------------------------------------------------ the components' state, as callers read it

    @property
    def clients(self) -> dict[Any, ClientState]:
        return self.registers.clients

    @property
    def index(self) -> SubscriptionIndex:
        return self.registers.index

    @property
    def digest(self) -> list[int]:
        return self.registers.digest

    @property
    def own(self) -> Ownership | None:
        return self.place.own

    @property
    def map_epoch(self) -> int:
        return self.place.map_epoch

    @property
    def redirect_frame(self) -> bytes | None:
        return self.place.redirect_frame

    @property
    def budgets(self) -> SubscriptionBudgets:
        return self.registers.budgets

    @property
    def text_subs(self) -> int:
        return self.registers.text_subs

    @property
    def replicating(self) -> bool:
        return self.registers.replicating

    @property
    def tombstone_horizon(self) -> float:
        return self.registers.tombstone_horizon

    @tombstone_horizon.setter
    def tombstone_horizon(self, horizon: float) -> None:
        self.registers.tombstone_horizon = horizon

    @property
    def expire_skipped(self) -> int:
        return self.registers.expire_skipped

    @property
    def changes(self) -> int:
        """Registers changed (local writes and merges), ever: a snapshot is due when this moved."""
        return self.registers.changes

    @changes.setter
    def changes(self, n: int) -> None:
        self.registers.changes = n

    @property
    def producers(self) -> dict[bytes, ProducerState]:
        return self.producing.producers

    @property
    def producer_hosts(self) -> dict[str, dict[bytes, None]]:
        return self.producing.producer_hosts

    @property
    def text_leases(self) -> dict[tuple[Addr, str], float]:
        return self.text.text_leases

    # ------------------------------------------------------------ set-up by the member core

    def set_cluster_map(self, cmap: list[Any] | None, epoch: int) -> None:
        """Partitioned mode: the cluster map the member core installed, in its wire form
        (client/clustermap.py, ``encode``; the node package does not interpret it), and its
        epoch. WELCOME carries it from now on (or, where it would break the anti-amplification
        budget, only its epoch, and the client asks with MAP); a binary client whose PUB or SUB
        reaches us for a partition we are not primary of gets it in a REDIRECT, once per epoch."""
        base = {k: v for k, v in self.params.items() if k not in ("map", "map_epoch")}
        place = self.place
        if cmap is None:
            self.params = self._lean_params = base
            place.map_epoch, place.redirect_frame = 0, None
            return
        self._lean_params = {**base, "map_epoch": epoch}
        self.params = {**self._lean_params, "map": cmap}
        place.map_epoch = epoch
        place.redirect_frame = wire.encode_redirect(self.node_id, cmap)

    def set_ownership(self, own: Ownership) -> None:
        """Partitioned mode, from the start (before any register): one digest bucket per partition."""
        self.registers.set_ownership(own)

    def reindex(self, gained: set[int], lost: set[int], now: float | None = None) -> None:
        """The map changed: index the registers of partitions gained, unindex those lost."""
        self.registers.reindex(gained, lost, now)

    def dump(self, buckets: set[int] | None = None, home: str | None = None, ours: bool = False) -> Any:
        """Every client's entry (or only the registers in ``buckets``): node/registers.py."""
        return self.registers.dump(buckets, home, ours)

    def text_budget(self, c: ClientState, n: int) -> bool:
        """May ``n`` more bytes go to text client ``c``? (node/delivery.py)"""
        return self.delivery.text_budget(c, n)

    def drop_client(self, c: ClientState, now: float) -> None:
        """The client is gone: end its subscriptions everywhere and free its state."""
        self.sessions.drop_client(c, now)

    # ------------------------------------------------------------ entry points

    def handle_datagrams(self, datagrams: list[tuple[bytes, Addr]], now: float) -> list[Action]:
        """Process a batch of datagrams in arrival order; return what to send."""
        self.outbox.now = now
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
                    if not self._text_allowed(addr[0]):
                        raise WireError(ErrorCode.FORBIDDEN, "text protocol not allowed from this network")
                    self.text.on_text(data, addr, now)
                else:
                    self._on_binary(data, addr, now)
            except WireError as exc:
                self._error(addr, exc, len(data), is_text)
        return self._finish(now)

    def tick(self, now: float) -> list[Action]:
        """Fire every timer that is due: retransmissions, timeouts, expiries."""
        timers = self.outbox.timers
        self.outbox.now = now
        while timers and timers[0][0] <= now:
            _, kind, key = heapq.heappop(timers)
            if kind == TIMER_RTO:
                self.delivery.on_rto(key, now)
            elif kind == TIMER_LIVENESS:
                self.sessions.on_liveness(key, now)
            elif kind == TIMER_LEASE:
                self.text.on_lease(key, now)
            else:
                self.producing.on_timer(key, now)
        return self._finish(now)

    def next_deadline(self) -> float | None:
        timers = self.outbox.timers
        return timers[0][0] if timers else None

    def merge(self, entries: list[Any], now: float) -> list[Action]:
        """Apply replicated entries (already validated); ``changes`` counts the
        registers that moved. Returns what that causes (re-asserted writes to
        replicate, logs).

        Last writer wins per register, so any order, repetition or grouping of
        the same entries leaves the same state.
        """
        self.outbox.now = now
        for addr, topic in self.registers.merge(entries, now):
            self.text.merged(addr, topic, now)
        return self._finish(now)

    def forwarded(self, msgs: list[Any], now: float, ours: bool = False) -> tuple[list[Action], list[int]]:
        """Partitioned mode: messages another member forwarded to us (validated by
        the caller), or (``ours``) our own forwards to route again by a new map.
        Also returns the indexes of the messages refused (not ours to deliver)."""
        self.outbox.now = now
        refused, settled = self.forwarding.deliver(msgs, ours)
        for pid, seq in settled:
            self.producing.settle(pid, seq)
        return self._finish(now), refused

    def settle_forwards(self, msgs: list[Any], now: float) -> list[Action]:
        """Partitioned mode: our forwarded messages that a primary took into its mailboxes (or
        that we gave up: no owner, a full queue); their PUBACKs may go out now."""
        self.outbox.now = now
        for _, _, _, _, pid, seq in msgs:  # (a forward: topic, key, tags, payload, producer id, sequence)
            if pid is not None:
                self.producing.settle(pid, seq)
        return self._finish(now)

    def expire_home(self, home: str, now: float) -> list[Action]:
        """Tombstone the subscriptions of binary clients whose home node ``home`` is gone."""
        self.outbox.now = now
        self.registers.expire_home(home, now)
        return self._finish(now)

    def collect_tombstones(self, now: float) -> list[Action]:
        """Forget tombstones older than ``tombstone_horizon``, and empty records."""
        self.outbox.now = now
        self.registers.collect_tombstones(now)
        return self._finish(now)

    def _finish(self, now: float) -> list[Action]:
        """End of an entry point: coalesced sends, then the changes to replicate."""
        self.delivery.flush(now)
        out = self.outbox.out
        forwards = self.forwarding.forwards
        if forwards:
            out.extend(Forward(m, msgs) for m, msgs in forwards.items())
            forwards.clear()
        relays = self.delivery.relays
        if relays:
            out.extend(Relay(m, sends) for m, sends in relays.items())
            relays.clear()
        if self.registers.changed:
            out.append(Replicate(self.registers.take_changes()))
        actions = out[:]
        del out[:]  # (the list stays: the components hold it)
        return actions

    # ------------------------------------------------------------ dispatch

    def _on_binary(self, data: bytes, addr: Addr, now: float) -> None:
        f = decoding.decode_untrusted_frame(data, self._max)
        ftype = f[D.TYPE]
        wall = now + self.wall_offset
        if ftype is FrameType.HELLO:
            cookie = self.cookies.issue(addr, f[D.CLIENT_ID], wall)
            welcome = wire.encode_welcome(self.node_id, cookie, self.params, self.members)
            if len(welcome) > AMPLIFICATION * len(data) and self.params is not self._lean_params:
                self.metrics["welcome_without_map"] += 1  # (the client asks for it with MAP)
                welcome = wire.encode_welcome(self.node_id, cookie, self._lean_params, self.members)
            self._bounded(addr, welcome, len(data))
            return
        if ftype not in _CLIENT_FRAMES:
            raise WireError(ErrorCode.UNKNOWN_TYPE, f"{ftype.name} is not sent to nodes")
        cid, cookie = f[D.CLIENT_ID], f[D.COOKIE]
        if not (self._any_cookie or self.cookies.check(addr, cid, cookie, wall)):
            raise WireError(ErrorCode.BAD_COOKIE, "cookie invalid or expired for this address; send HELLO")
        c = self.registers.clients.get(cid)
        sessions = self.sessions
        if ftype is FrameType.CMDS:  # (a stale session must not touch c)
            sessions.on_cmds(c, cid, addr, f[D.CMDS_SESSION], f[D.CMDS_BATCH], f[D.CMDS_COMMANDS], now)
            return
        if ftype is FrameType.BYE:
            sessions.on_bye(c, addr, f[D.BYE_SESSION], now)
            return
        # A PING of a process the client id has since been restarted in (a lower session) is
        # answered, but is neither liveness nor a reason to move the client to its address.
        stale = ftype is FrameType.PING and c is not None and 0 < f[D.PING_SESSION] < c.session
        if ftype is FrameType.PING and c is not None and not stale:
            sessions.may_move(c, addr)  # (refused: no liveness either, so the record at its old address times out)
        if c is not None and not stale:
            c.last_seen = c.heard = now
        if ftype is FrameType.PUB:
            self.producing.on_pub(addr, f, now, data)
        elif ftype is FrameType.PUBRUN:
            self.producing.on_pubrun(addr, f, now)
        elif ftype is FrameType.ACK:
            if c is not None:
                self.delivery.on_ack(c, f[D.ACK_STREAM], f[D.ACK_MAX_SEQ], f[D.ACK_SACK], now)
        elif ftype is FrameType.PING:
            taken = False
            if stale:
                self.metrics["stale_pings"] += 1
            elif c is not None:  # the client talks to this node now: ours to watch
                taken = sessions.adopt(c, addr, now, f[D.PING_SESSION])
            fresh = self.cookies.is_fresh(addr, cid, cookie, wall)
            sessions.on_ping(c, addr, f[D.PING_TOKEN], cookie if fresh else self.cookies.issue(addr, cid, wall),
                             f[D.PING_DIGEST], taken)  # fmt: skip
        elif ftype is FrameType.PUT:
            msgs, p = f[D.PUT_MESSAGES], f[D.PUT_PARTITION]
            for m in msgs:
                self._durable_partition(m[D.MSG_TOPIC], p)
            self.outbox.out.append(DurablePut(addr, f[D.PUT_PRODUCER], p, f[D.PUT_FIRST], f[D.PUT_FLOOR],
                                              [list(m) for m in msgs]))  # fmt: skip
        elif ftype is FrameType.GET:
            self._durable_partition(f[D.GET_TOPIC], f[D.GET_PARTITION])
            self.outbox.out.append(DurableGet(addr, f[D.GET_DURABLE], f[D.GET_NAME], f[D.GET_TOPIC],
                                              f[D.GET_PARTITION], f[D.GET_START], f[D.GET_START_AT], f[D.GET_MAX],
                                              f[D.GET_READ_FROM]))  # fmt: skip
        elif ftype is FrameType.COMMIT:
            self._durable_partition(f[D.COMMIT_TOPIC], f[D.COMMIT_PARTITION])
            self.outbox.out.append(DurableCommit(addr, f[D.COMMIT_DURABLE], f[D.COMMIT_NAME], f[D.COMMIT_TOPIC],
                                                 f[D.COMMIT_PARTITION], f[D.COMMIT_OFFSET]))  # fmt: skip
        elif ftype is FrameType.MAP:
            if self.place.redirect_frame is None:
                raise WireError(
                    ErrorCode.UNKNOWN_TYPE, "no cluster map: this node is not a member of a partitioned cluster"
                )
            self.outbox.send(addr, self.place.redirect_frame)
        else:
            self.outbox.out.append(StatusQuery(addr, self.status()))

    def _durable_partition(self, topic: str, p: int) -> None:
        """A durable request names ``topic`` in partition ``p``: refused unless this is a member
        of a partitioned cluster and ``p`` is the topic's partition."""
        own = self.place.own
        if own is None:
            raise WireError(ErrorCode.UNKNOWN_TYPE, "durable publishes need a member of a partitioned cluster")
        if p >= own.partitions:
            raise WireError(ErrorCode.MALFORMED, f"partition {p}: the cluster has {own.partitions} partitions")
        if own.partition(topic) != p:
            raise WireError(ErrorCode.MALFORMED, f"topic {topic!r} is not in partition {p}")

    # ------------------------------------------------------------ what a source may send and be sent

    def _over_rate(self, host: str, n: int, now: float) -> bool:
        """Has ``host`` sent more than its bytes per second (a bucket of one second's worth)?
        Spends ``n`` from its budget if not."""
        rate = self.cfg.max_host_bytes_per_second
        tokens = self._host_tokens.get(host)
        if tokens is None:
            if len(self._host_tokens) >= 65536:  # (hosts silent for a second have a full bucket: forget them)
                quiet = [h for h, at in self._host_at.items() if now - at >= 1.0]
                for h in quiet:
                    del self._host_tokens[h], self._host_at[h]
            tokens = rate
        else:
            tokens = min(rate, tokens + max(0.0, now - self._host_at[host]) * rate)
        self._host_at[host] = now
        if tokens < n:
            self._host_tokens[host] = tokens
            self.metrics["dropped_host_rate"] += 1
            return True
        self._host_tokens[host] = tokens - n
        return False

    def _text_allowed(self, host: str) -> bool:
        """Is ``host`` on ``text_networks``? Those sources may use the text
        protocol and are trusted with every error reply."""
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

    def _error(self, addr: Addr, exc: WireError, req_len: int, is_text: bool) -> None:
        """Reply with an error, within the amplification budget of the source."""
        self.metrics["errors"] += 1
        self.metrics[f"error_{exc.code.name.lower()}"] += 1
        trusted = self._text_allowed(addr[0])
        if is_text:
            if trusted:  # (within 3x of the datagram too: a text source address may be forged)
                self.outbox.send(addr, encode_text_error(exc.code, exc.text)[: min(self._max, AMPLIFICATION * req_len)])
            else:
                self.metrics["dropped_forbidden"] += 1
            return
        # Every source gets only what the anti-amplification budget allows, trusted or not: an
        # address on the text networks can be forged as well as any.
        self._bounded(addr, wire.encode_error(exc.code, exc.text), req_len)

    def _bounded(self, addr: Addr, data: bytes, req_len: float) -> None:
        """Send to an address that has not proven it receives: at most 3x in."""
        if len(data) <= AMPLIFICATION * req_len:
            self.outbox.send(addr, data)
        else:
            self.metrics["dropped_amplification"] += 1

    # ------------------------------------------------------------ inspection

    def state_digest(self) -> tuple[Any, ...]:
        """Everything a datagram could change, for tests that check it did not."""
        index = self.index
        return (
            sorted(
                (t, repr(k), repr(w), m)
                for t, keys in [*index.topics.items(), *((f, fs.keys) for f, fs in index.filters.items())]
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
        index = self.index
        return {
            "node": self.node_id,
            "clients": sum(1 for c in self.clients.values() if c.live),
            "subscriptions": index.count,
            "topics": len(index.topics),
            "filters": len(index.filters),  # (wildcards, queries, queue groups: client/subjects.py)
            "producers": len(self.producers),
            "pid": self.pid,
            "monitor": self.cfg.monitor_addr or None,  # (roost status and top read it)
            "metrics": dict(self.metrics),
        }
