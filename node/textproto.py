"""The FASTPUSS text protocol on the node: ``PUB``, ``SUB`` and ``UNSUB`` datagrams.

Text has no handshake, so a source address cannot be validated: it is
accepted only from ``text_networks`` (loopback by default). A text
subscriber is keyed by its source address and its subscriptions are fire
registers like a binary client's (node/registers.py), so text and binary
clients share topics and a cluster replicates both. A text PUB is published
with no key and no tags; text subscribers get ``MSG <topic>\\n<body>``
(node/delivery.py). Whether a source may use text at all (``text_networks``) is checked
before (node/core.py).

Text subscriptions have no liveness of their own, and their source address is never
validated (anyone on a trusted network can forge it), so two rules keep a forged SUB from
turning the node into a reflector:

- each subscription ends ``text_sub_lease`` after its last ``SUB`` (by default; 0 keeps it
  until UNSUB). ``text_leases`` holds the expiry per (address, topic); one timer per lease
  re-arms itself when a renewal moved the expiry;
- the address is sent at most ``text_amplification`` (3) times the bytes it sent: every text
  datagram from it adds that much to its record's credit, every MSG line to it spends
  from it, and what finds no credit is dropped and counted (``dropped_text_budget``). It is
  the binary protocol's rule before a cookie comes back, kept for good, since a text client
  never proves its address. A subscriber that wants more sends more: a SUB's body is ignored,
  so it may pad it, or it renews. In a cluster the member the SUB came to, its home, keeps the
  credit and sends every MSG line (other members relay them to it: node/delivery.py).
"""

from __future__ import annotations

from collections import Counter

from roost.client import wire
from roost.client.text import parse_untrusted_text
from roost.client.wire import ErrorCode, Mode, WireError
from roost.node import versions
from roost.node.admission import host_key
from roost.node.budgets import utf8_len
from roost.node.clients import ClientState
from roost.node.config import NodeConfig
from roost.node.cookies import Addr
from roost.node.fanout import Fanout
from roost.node.forwarding import Forwarding
from roost.node.outbox import TIMER_LEASE, Outbox, fmt
from roost.node.placement import Placement
from roost.node.registers import Registers


class TextProtocol:
    def __init__(
        self, config: NodeConfig, metrics: Counter[str], outbox: Outbox, place: Placement, registers: Registers,
        fanout: Fanout, forwarding: Forwarding,
    ) -> None:  # fmt: skip
        self.cfg = config
        self.node_id = config.id
        self.metrics = metrics
        self.outbox = outbox
        self.place = place
        self.registers = registers
        self.fanout = fanout
        self.forwarding = forwarding
        self.clients = registers.clients
        self._max = config.max_datagram
        self.text_leases: dict[tuple[Addr, str], float] = {}  # -> expiry

    def on_text(self, data: bytes, addr: Addr, now: float) -> None:
        verb, topic, body = parse_untrusted_text(data)
        if verb == "PUB":
            wire.check_topic(topic)
            payload = body.encode()
            if len(payload) + len(topic) + wire.MSGS_HEADER_MAX + 16 > self._max:
                raise WireError(ErrorCode.TOO_LARGE, "body too large to be delivered in one datagram")
            self.metrics["published"] += 1
            dest = None if self.place.own is None else self.place.own.forward_to(topic)
            if dest is None and self.place.own is not None and self.place.own.unowned(topic):
                self.metrics["forward_dropped"] += 1  # (a leaver that hears no owner; fire: at most once)
            elif dest is None:
                self.fanout.publish(topic, None, None, payload, None)
            else:
                self.forwarding.forward(dest, [topic, None, None, payload, None, None])
            self._credit(addr, len(data))
            return
        wire.check_filter(topic)  # (a pattern: the text protocol has no queue groups or queries, no spaces)
        tk = (topic, None)
        c = self.clients.get(addr)
        if verb == "SUB":
            if c is None or not c.subs.get(tk, 0) & versions.PRESENT:
                regs = self.registers
                refused, setting = regs.sub_budget(c.live if c else 0, host_key(addr[0]), utf8_len(topic), now,
                                                   regs.text_subs, c is not None and tk in c.subs)  # fmt: skip
                if refused:
                    raise WireError(
                        ErrorCode(refused), f"subscription refused: {setting} = {getattr(self.cfg, setting)}"
                    )
                if c is None:
                    c = self.registers.new_client(addr, addr, now)
                elif not c.local or c.home != self.node_id:
                    self._text_home(c, now)
                self.registers.write(c, tk, True, Mode.FIRE, now)
                self.outbox.log("debug", "text_subscribe", addr=fmt(addr), topic=topic)
            elif not c.local or c.home != self.node_id:
                self._text_home(c, now)  # (a renewal at another member: the home moves with it)
            self._lease(addr, topic, now)
        elif c is not None and c.subs.get(tk, 0) & versions.PRESENT:  # UNSUB
            self.registers.write(c, tk, False, Mode.FIRE, now)
            self.text_leases.pop((addr, topic), None)
            self.outbox.log("debug", "text_unsubscribe", addr=fmt(addr), topic=topic)
        self._credit(addr, len(data))

    def _text_home(self, c: ClientState, now: float) -> None:
        """A text address subscribes here again (its record outlived its last subscription in a
        cluster, or it came from the member it subscribed at before): this member is its home
        from now on, which holds its credit, relays, leases and registers."""
        c.local = True
        if c.home != self.node_id:
            c.home = self.node_id
            self.registers.set_cver(c, self.registers.version(now, True, 0))
            self.registers.mark_changed(c, None)
            self.registers.budgets.rehome(c, host_key(c.cid[0]))  # (charged to its host here now)
            for (topic, _), v in c.subs.items():  # (and its subscriptions last a lease from now)
                if v & versions.PRESENT:
                    self._lease(c.cid, topic, now)

    def _credit(self, addr: Addr, n: int) -> None:
        """A text datagram of ``n`` bytes came from ``addr``: what it may be sent grows."""
        c = self.clients.get(addr)
        if c is not None and c.local:
            c.credit += self.cfg.text_amplification * n

    def _lease(self, addr: Addr, topic: str, now: float) -> None:
        """The subscription of ``addr`` to ``topic`` lasts ``text_sub_lease`` from now."""
        lease = self.cfg.text_sub_lease
        if lease > 0:
            key = (addr, topic)
            if key not in self.text_leases:
                self.outbox.timer(now + lease, TIMER_LEASE, key)
            self.text_leases[key] = now + lease

    def merged(self, addr: Addr, topic: str, now: float) -> None:
        """A text subscription of ours came back by merge (a snapshot, a PULL): its lease
        starts again."""
        if (addr, topic) not in self.text_leases:
            self._lease(addr, topic, now)

    def on_lease(self, key: tuple[Addr, str], now: float) -> None:
        """Lease timer: end the text subscription unless a SUB renewed it."""
        until = self.text_leases.get(key)
        if until is None:
            return
        if until > now:
            self.outbox.timer(until, TIMER_LEASE, key)
            return
        del self.text_leases[key]
        c = self.clients.get(key[0])
        if c is not None and c.home != self.node_id:
            return  # (its home is another member now: its lease runs there)
        if c is not None and c.subs.get((key[1], None), 0) & versions.PRESENT:
            self.registers.write(c, (key[1], None), False, Mode.FIRE, now)
            self.outbox.log("info", "text_lease_expired", addr=fmt(key[0]), topic=key[1])
