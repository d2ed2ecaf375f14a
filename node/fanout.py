"""Fan-out: one published message to every subscriber that matches.

Theory of operation. ``publish`` looks the message up in the subscription index and, per
subscriber, appends the packed message to the client's mailbox (reliable) or fire list, and
queues the client for this batch's output once (node/delivery.py sends it at the end of the
entry point). Subscribers of wildcard and query filters are added to those of the bare topic,
and each queue group gives one member a marked copy (node/queuegroups.py). A mailbox that would
overflow cancels every reliable subscription of its client (``overflow``: out of capacity), which
the registers replicate. Text subscribers get their MSG line from their home member
(``Delivery.to_text``). This is the hot path: one index lookup and one pack per message, the
attributes it reads hoisted into locals, nothing allocated per subscriber but what it is given.

With ``cfg.trace`` (the simulator's) each message published here is also a ``Trace`` action
``publish``: its topic and payload, whether this member owns its partition, and the reliable
subscribers it is owed to as the registers stand before it is queued (client id, address,
session, the version of its subscription to the bare topic): what sim/accounting.py checks
the deliveries against.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgpack

from roost.client import wire
from roost.client.text import encode_text_msg
from roost.client.wire import Mode, Reason
from roost.node import versions
from roost.node.clients import ClientState
from roost.node.config import NodeConfig
from roost.node.delivery import Delivery
from roost.node.outbox import Outbox, fmt
from roost.node.placement import Placement
from roost.node.queuegroups import QueueGroups
from roost.node.registers import Registers

_LIVE_RELIABLE = versions.PRESENT | versions.RELIABLE


class Fanout:
    def __init__(
        self, config: NodeConfig, metrics: Counter[str], outbox: Outbox, place: Placement, registers: Registers,
        groups: QueueGroups, delivery: Delivery,
    ) -> None:  # fmt: skip
        self.cfg = config
        self.metrics = metrics
        self.outbox = outbox
        self.place = place
        self.registers = registers
        self.groups = groups
        self.delivery = delivery
        self.clients = registers.clients
        self.index = registers.index
        self.dirty = delivery.dirty
        self.trace = config.trace

    def publish(
        self,
        topic: str,
        key: str | None,
        tags: dict[str, str] | None,
        payload: bytes,
        packed: bytes | None,
    ) -> None:
        """Queue one message for every subscriber that matches (hot path)."""
        if self.trace:
            self._trace(topic, payload)
        index = self.index
        subs = index.match(topic, key)
        if subs:  # (what /subsz shows: one dict update per message, not per subscriber)
            matched = index.matched
            matched[topic] = matched.get(topic, 0) + 1
        if index.filters:
            subs, picks = self.groups.filtered(topic, key, tags, subs)
            if picks:
                if packed is None:
                    packed = wire.pack_message(topic, key, tags, payload)
                self._give_picked(picks, packed)
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
                    self.dirty.append(c)
            else:
                if text_msg is None:
                    text_msg = encode_text_msg(topic, payload)
                self.delivery.to_text(who, text_msg)
        if full is not None:
            for c in full:
                if c.mailbox is not None:
                    self.overflow(c)

    def _trace(self, topic: str, payload: bytes) -> None:
        """The ``publish`` Trace action (see the module's docstring)."""
        own = self.place.own
        owes = []
        clients = self.clients
        for cid, mode in (self.index.match(topic, None) or {}).items():
            c = clients.get(cid)
            if mode and c is not None:
                owes.append((cid, c.addr, c.session, c.subs.get((topic, None), 0)))
        self.outbox.trace("publish", topic=topic, payload=payload, owned=own is None or own.owns(topic), owes=owes)

    def _give_picked(self, picks: dict[Any, list[Any]], packed: bytes) -> None:
        """The queue groups' copies of a message, marked for the members picked."""
        for who, (mode, marks) in picks.items():
            c = self.clients[who]
            mine = wire.mark_delivery(packed, marks)
            if not mode:
                c.fire.append(mine)
            elif c.mailbox is not None and c.mailbox.push(mine):
                c.mailbox.queued = True
            else:
                # (full: another member takes it, and this one is cancelled)
                self.groups.requeue_one([*msgpack.unpackb(packed), marks], who)
                if c.mailbox is not None:
                    self.overflow(c)
                continue
            if not c.dirty:
                c.dirty = True
                self.dirty.append(c)

    def overflow(self, c: ClientState) -> None:
        """Mailbox full: cancel every reliable subscription of this client."""
        self.metrics["cancelled_out_of_capacity"] += 1
        now = self.outbox.now
        write = self.registers.write
        for tk, v in list(c.subs.items()):
            if v & _LIVE_RELIABLE == _LIVE_RELIABLE:
                write(c, tk, False, Mode.RELIABLE, now, versions.REASON_OUT_OF_CAPACITY)
                c.cancelled[tk] = Reason.OUT_OF_CAPACITY
                self.outbox.send(c.addr, wire.encode_cancel(tk[0], tk[1], Reason.OUT_OF_CAPACITY))
        c.mailbox = None
        self.outbox.log("warning", "out_of_capacity", client=c.cid.hex(), addr=fmt(c.addr))
