"""Messages a member forwards to another partition's primary (partitioned mode; sans-IO).

Theory of operation. A member that accepts a publish for a partition it is not
primary of (a text client, or a binary client whose home it is) forwards the
message over its peer link to the primary (docs/cluster.md, "Routing"). One
:class:`ForwardQueue` per destination member holds them:

* reliable messages wait in ``pending`` and go out in FORWARD frames, a window
  of frames in flight, each acknowledged by FWDACK; a link that drops puts what
  was in flight back in front, in order (the primary may have delivered it
  already: it drops the resend by producer id and sequence, node/delivery.py
  ``_fwd_seen``; leaving it to the subscribers' de-duplication handed it, late,
  to a subscription that reached the primary in between: seeds 5317, 7386);
* fire messages go out at once if the link is up and are dropped otherwise
  (fire is at most once: they are never sent twice);
* the receiver delivers what it owns and refuses the rest (FWDACK lists them:
  its map differs from ours for a moment); refused messages are ``parked`` and
  routed again at the next heartbeat or map change, so a message stays with
  the member that accepted it from its publisher until an owner has it;
* when the map changes, :meth:`take` hands the member everything not yet
  acknowledged (all of it if the destination is gone, the unsent and parked
  part otherwise), oldest first, to route again by the new map.

A reliable message is acknowledged to its publisher only once a primary has it
(FWDACK, node/delivery.py ``_unsettled``): the client library moves a topic to a
new primary once the old route acknowledged everything, so nothing sent
straight to the new primary overtakes what waits here. A queue holds at most
``max_queue`` reliable messages; beyond that new ones are dropped, counted and
logged (``forward_overflow``), and acknowledged as given up.

:class:`Forwarding` is the member's component for all of it: one ForwardQueue per peer, the
reliable messages no live owner can take yet (``unrouted``, routed again at the next map
change), FORWARD and RELAY frames out and in. What the broker core must settle or route again
is returned to the member, which hands it to the broker core (the member routes the broker's
actions); the links, the broker core and the action list are shared.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from roost.cluster.links import LinkTable
from roost.cluster.peerwire import PeerProtocolError, PeerType, check_forwarded_untrusted, check_relay_untrusted, encode
from roost.node.actions import Log, Send
from roost.node.core import BrokerCore

Msg = list[Any]  # [topic, key, tags, payload, producer id | None, sequence | None]


class ForwardQueue:
    def __init__(self, max_queue: int, max_bytes: int = 1 << 22, chunk: int = 256, window: int = 8) -> None:
        """A FORWARD frame holds at most ``chunk`` messages and about ``max_bytes`` (half of
        the peer link's max_frame: 256 messages of 64 KB would not fit one)."""
        self.max_queue = max_queue
        self.max_bytes = max_bytes
        self.chunk = chunk
        self.window = window
        self.pending: deque[Msg] = deque()
        self.inflight: dict[int, list[Msg]] = {}
        self.parked: list[Msg] = []  # refused by the receiver: to route again
        self.next_id = 1

    def __len__(self) -> int:
        return len(self.pending) + len(self.parked) + sum(len(b) for b in self.inflight.values())

    def add(self, msgs: list[Msg]) -> list[Msg]:
        """Queue reliable messages (a caller sends fire ones itself, once); returns those
        dropped for want of room."""
        room = max(self.max_queue - len(self), 0)
        dropped = msgs[room:]
        self.pending.extend(msgs[:room])
        return dropped

    def next_frame(self) -> tuple[int, list[Msg]] | None:
        """The next FORWARD to send, if the window allows one."""
        if not self.pending or len(self.inflight) >= self.window:
            return None
        n = min(self.chunk, len(self.pending))
        pending, limit = self.pending, self.max_bytes
        batch = [pending.popleft()]
        size = len(batch[0][3]) + 256  # (a payload and about its topic, key and tags)
        while len(batch) < n and size + len(pending[0][3]) + 256 <= limit:
            size += len(pending[0][3]) + 256
            batch.append(pending.popleft())
        fid = self.next_id
        self.next_id += 1
        self.inflight[fid] = batch
        return fid, batch

    def acked(self, fid: int, refused: list[int]) -> list[Msg]:
        """FWDACK: the receiver delivered the frame's messages but those it ``refused``;
        returns the delivered ones (none for a frame no longer in flight: taken back)."""
        batch = self.inflight.pop(fid, None)
        if batch is None:
            return []
        no = set(refused)
        self.parked.extend(batch[i] for i in sorted(no) if i < len(batch))
        return [m for i, m in enumerate(batch) if i not in no]

    def disconnected(self) -> None:
        """The link dropped: what was in flight goes back to the front, in order."""
        for fid in sorted(self.inflight, reverse=True):
            self.pending.extendleft(reversed(self.inflight[fid]))
        self.inflight.clear()

    def take(self, everything: bool) -> list[Msg]:
        """Messages to route again: the unsent ones, and those in flight too if
        ``everything`` (the destination is no longer live)."""
        if everything:
            self.disconnected()
        out = self.parked + list(self.pending)  # (oldest first: parked ones were sent before)
        self.pending.clear()
        self.parked = []
        return out


class Forwarding:
    def __init__(self, peers: list[str], max_queue: int, max_bytes: int, broker: BrokerCore, links: LinkTable,
                 actions: list[Any]) -> None:  # fmt: skip
        self.max_queue = max_queue
        self.max_bytes = max_bytes
        self.broker = broker
        self.links = links
        self._out = actions
        self.queues = {p: ForwardQueue(max_queue, max_bytes) for p in peers}
        # Reliable messages with no live owner in our map (a leaver that hears no placed member):
        # kept unacknowledged and routed again at the next map change (review, 2026-11-24: they were
        # delivered here, to nobody, and acknowledged)
        self.unrouted: list[Msg] = []

    def add_peer(self, peer: str) -> None:
        self.queues[peer] = ForwardQueue(self.max_queue, self.max_bytes)

    def forward(self, member: str, msgs: list[Msg]) -> list[Msg] | None:
        """The broker core's ``Forward``: fire messages go at once (or are dropped), reliable ones
        are queued and sent as the window allows. Returns the messages given up (no room, no such
        member), which the member settles with the broker core and then calls :meth:`pump`."""
        metrics = self.broker.metrics
        if member == "":  # (no live owner)
            reliable = [m for m in msgs if m[4] is not None]
            metrics["forward_dropped"] += len(msgs) - len(reliable)
            room = max(0, self.max_queue - len(self.unrouted))
            self.unrouted.extend(reliable[:room])
            if reliable[room:]:
                metrics["forward_overflow"] += len(reliable) - room
                return reliable[room:]
            return None
        q = self.queues.get(member)
        if q is None:
            metrics["forward_dropped"] += len(msgs)
            return msgs
        fire = [m for m in msgs if m[4] is None]
        if fire:
            lid = self.links.up(member)
            if lid is not None:
                self.links.frame(lid, encode([PeerType.FORWARD, 0, fire]))
            else:
                metrics["forward_dropped"] += len(fire)
        if len(fire) < len(msgs):
            dropped = q.add([m for m in msgs if m[4] is not None])
            if dropped:
                metrics["forward_overflow"] += len(dropped)
                self._out.append(Log("warning", "forward_overflow", {"peer": member, "dropped": len(dropped)}))
                return dropped
            self.pump(member)
        return None

    def pump(self, peer: str) -> None:
        """FORWARD frames to ``peer`` as its window allows, if our link to it is up."""
        lid, q = self.links.up(peer), self.queues.get(peer)
        if lid is None or q is None:  # (no link, or no queue: nothing to send, as for "", no live owner)
            return
        frame = self.links.frame
        while (f := q.next_frame()) is not None:
            fid, msgs = f
            frame(lid, encode([PeerType.FORWARD, fid, msgs]))

    def to_route_again(self, live: frozenset[str] | set[str]) -> Iterator[list[Msg]]:
        """The map changed: per peer, what is not acknowledged (everything, for a peer no longer
        live), then what had no live owner, for the member to route again (lazily: one batch is
        routed before the next is taken)."""
        for peer, q in self.queues.items():
            yield q.take(everything=peer not in live)
        if self.unrouted:
            msgs, self.unrouted = self.unrouted, []
            yield msgs

    def refused(self) -> Iterator[list[Msg]]:
        """Every heartbeat: messages a peer refused (its map differed), to route again ahead of the
        newer ones still queued."""
        for q in self.queues.values():
            if q.parked:
                yield q.take(everything=False)

    def relay(self, member: str, sends: list[Any]) -> None:
        """Text datagrams for a client whose home is ``member``: a RELAY frame (fire)."""
        lid = self.links.up(member)
        if lid is not None:
            self.links.frame(lid, encode([PeerType.RELAY, sends]))
        else:
            self.broker.metrics["relay_dropped"] += len(sends)

    def received(self, lid: int, fid: Any, msgs: Any, now: float) -> tuple[list[Any], bytes | None]:
        """A peer's FORWARD on link ``lid``: the broker core's actions, and the FWDACK to send
        after them (None for fire messages: refused ones are dropped, at most once)."""
        if fid.__class__ is not int or not 0 <= fid < 2**63:
            raise PeerProtocolError("malformed FORWARD")
        actions, refused = self.broker.forwarded(check_forwarded_untrusted(msgs), now)
        return actions, encode([PeerType.FWDACK, fid, refused]) if fid else None

    def acked(self, peer: str, fid: Any, refused: Any) -> list[Msg]:
        """A FWDACK: the messages delivered, for the member to settle; then :meth:`pump`."""
        if fid.__class__ is not int or refused.__class__ is not list \
                or not all(i.__class__ is int and 0 <= i < 65536 for i in refused):  # fmt: skip
            raise PeerProtocolError("malformed FWDACK")
        return self.queues[peer].acked(fid, refused)

    def relayed(self, sends: Any) -> None:
        """A peer's RELAY: datagrams for our text clients, within their budgets."""
        broker = self.broker
        clients = broker.clients
        for addr, data in check_relay_untrusted(sends):
            c = clients.get(addr)
            if c is not None and c.local:
                if broker.text_budget(c, len(data)):
                    self._out.append(Send(addr, data))
            else:
                broker.metrics["relay_refused"] += 1
