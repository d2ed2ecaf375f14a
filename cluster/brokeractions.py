"""What the broker core's actions become in a cluster member (sans-IO, no state of its own).

The broker core (node/core.py) knows nothing of peers: in a member, each of its actions that
concerns the cluster goes to the component that owns it, and the rest (datagrams to clients,
logs, traces) goes out as it is:

* ``Replicate``: the change goes into the peers' push queues (cluster/replicator.py);
* ``StatusQuery``: answered with the broker's status and the member's (cluster/memberstatus.py);
* ``Forward``/``Relay``: queued for another partition's primary or a client's home member
  (cluster/forwarding.py); messages given up are settled with the broker core at once;
* ``Confirm``: CMDACKs held until the changes they confirm are pushed (cluster/replicator.py),
  all of one batch together, after its ``Replicate`` (which comes last);
* ``DurablePut``/``DurableGet``/``DurableCommit``: the partition logs (cluster/durable.py).

:class:`BrokerActions` is the member's router for them, shared by the components that run the
broker core (the peer frames of cluster/peerframes.py); the member passes its phase and the
time with each batch. This is the hot path of every client datagram: one pass, compared by
class.
"""

from __future__ import annotations

from typing import Any

from roost.client.wire import encode_status_reply
from roost.cluster.durable import DurableLogs
from roost.cluster.events import Send
from roost.cluster.forwarding import Forwarding
from roost.cluster.memberstatus import MemberStatus
from roost.cluster.replicator import Replicator
from roost.node.core import (
    BrokerCore,
    Confirm,
    DurableCommit,
    DurableGet,
    DurablePut,
    Forward,
    Relay,
    Replicate,
    StatusQuery,
)


class BrokerActions:
    def __init__(self, broker: BrokerCore, replicator: Replicator, forwarding: Forwarding, durable: DurableLogs,
                 statusview: MemberStatus, actions: list[Any]) -> None:  # fmt: skip
        self.broker = broker
        self.replicator = replicator
        self.forwarding = forwarding
        self.durable = durable
        self.statusview = statusview
        self._out = actions

    def absorb(self, actions: list[Any], now: float, phase: str) -> None:
        """Pass the broker core's actions on; replicate its changes, answer STATUS."""
        out = self._out
        confirms = None
        for a in actions:
            cls = a.__class__
            if cls is Replicate:
                self.replicator.distribute(a.entries)
            elif cls is StatusQuery:
                out.append(Send(a.addr, encode_status_reply({**a.status, **self.statusview.status(phase, now)})))
            elif cls is Forward:
                given_up = self.forwarding.forward(a.member, a.msgs)
                if given_up is not None:
                    self.absorb(self.broker.settle_forwards(given_up, now), now, phase)
                    self.forwarding.pump(a.member)
            elif cls is Confirm:
                confirms = [Send(a.addr, a.data)] if confirms is None else [*confirms, Send(a.addr, a.data)]
            elif cls is Relay:
                self.forwarding.relay(a.member, a.sends)
            elif cls is DurablePut:
                self.durable.on_put(a, now, phase == "ready")
            elif cls is DurableGet:
                self.durable.on_get(a, now, phase == "ready")
            elif cls is DurableCommit:
                self.durable.on_commit(a, now, phase == "ready")
            else:
                out.append(a)
        if confirms is not None:  # (after the Replicate: it comes last)
            self.replicator.hold(confirms, now)

    def reroute(self, msgs: list[Any], now: float, phase: str) -> None:
        """Our own forwards, routed again by the current map (it moved, or a peer refused them)."""
        if msgs:
            self.absorb(self.broker.forwarded(msgs, now, ours=True)[0], now, phase)
