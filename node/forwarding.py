"""Partitioned mode: messages forwarded between members, to their partition's primary.

Theory of operation. A message published at a member that is not its partition's primary goes
to that primary (``forward``: collected per member, one ``Forward`` action each at the end of
the entry point; the member core sends them over its peer links). At the primary, ``deliver``
publishes what it owns and refuses, by index, what it does not: those stay with the sender
until its map or ours changes, since a member takes responsibility (FWDACK) only for what it
delivered, so no message rests with a member that is neither its acceptor nor its owner (review
finding #6). After a map change the sender routes its own unacknowledged forwards again
(``ours``). A reliable message forwarded to us is remembered by (producer id, sequence) for a
while (``_fwd_seen``): a sender whose link dropped before our FWDACK came back sends it again,
and publishing it twice would hand it, late, to a subscriber whose subscription reached us in
between, after newer messages of its producer (simulator seeds 5317, 7386).
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

from roost.client import wire
from roost.node.config import NodeConfig
from roost.node.fanout import Fanout
from roost.node.outbox import Outbox
from roost.node.placement import Placement

#: Forwarded reliable messages remembered by (producer id, sequence) to drop a resend, at most
#: (well over what a sender can have in flight to us when its link drops: 8 frames of 256 per
#: peer), and for at most producer_timeout (as a member forgets a silent producer).
FORWARDS_REMEMBERED = 1 << 18  # (about 2.6 s of forwards at 100,000 msgs/s: past a link's resend)
FORWARD_MEMORY_MIN = 5.0  # s: forgetting a younger one is counted (forward_memory_short)


class Forwarding:
    def __init__(
        self, config: NodeConfig, metrics: Counter[str], outbox: Outbox, place: Placement, fanout: Fanout
    ) -> None:
        self.cfg = config
        self.metrics = metrics
        self.outbox = outbox
        self.place = place
        self.fanout = fanout
        self.forwards: dict[str, list[list[Any]]] = {}  # member -> messages for it, this entry point
        # Forwarded reliable messages this member published, by (producer id, sequence), and
        # when, oldest first.
        self._fwd_seen: set[tuple[bytes, int]] = set()
        self._fwd_order: deque[tuple[float, bytes, int]] = deque()

    def forward(self, member: str, msg: list[Any]) -> None:
        self.forwards.setdefault(member, []).append(msg)
        self.metrics["forwarded_out"] += 1

    def deliver(self, msgs: list[Any], ours: bool) -> tuple[list[int], list[tuple[bytes, int]]]:
        """Messages another member forwarded to us, or (``ours``) our own to route
        again after the map changed. Ours go to the primary of the new map (or
        are delivered here if that is us). Another
        member's are delivered here if we own the partition (its primary or, when
        the maps differ for a moment, its secondary); with no owner live in our map
        (a leaver cut off) ours wait unacknowledged (``Forward`` to "", routed
        again at the next map change), and a peer's are refused; the others are
        refused. Returns the indexes of the messages refused, and the (producer id, sequence)
        of our reliable ones that are settled now (delivered here: node/producers.py may
        acknowledge them)."""
        own = self.place.own
        if own is None:
            self.metrics["forward_unexpected"] += len(msgs)
            return list(range(len(msgs))), []
        refused = []
        settled: list[tuple[bytes, int]] = []
        now = self.outbox.now
        self._forget(now)
        publish = self.fanout.publish
        for i, m in enumerate(msgs):
            topic, key, tags, payload, pid, seq = m
            dest = own.forward_to(topic)
            if dest is None and own.unowned(topic):  # (a leaver that hears no owner: not here either)
                dest = ""
            if dest is not None and ours:
                self.forward(dest, m)
            elif (dest is None or own.owns(topic)) and dest != "":
                if pid is not None and (pid, seq) in self._fwd_seen:
                    # A resend of one we published (its sender's link dropped before our FWDACK
                    # came back): delivered already, and acknowledged again as such.
                    self.metrics["forward_duplicates"] += 1
                else:
                    if pid is not None:
                        self._fwd_seen.add((pid, seq))
                        self._fwd_order.append((now, pid, seq))
                    packed = (wire.pack_message(topic, key, tags, payload) if pid is None
                              else wire.pack_delivery(topic, key, tags, payload, pid, seq))  # fmt: skip
                    publish(topic, key, tags, payload, packed)
                    self.metrics["forwarded_in" if not ours else "rerouted_here"] += 1
                if ours and pid is not None:
                    settled.append((pid, seq))
            else:
                refused.append(i)
                self.metrics["forward_refused"] += 1
        return refused, settled

    def _forget(self, now: float) -> None:
        """Forget the oldest forwarded messages: beyond FORWARDS_REMEMBERED or producer_timeout."""
        order, seen = self._fwd_order, self._fwd_seen
        horizon = now - self.cfg.producer_timeout
        while order and (len(order) >= FORWARDS_REMEMBERED or order[0][0] <= horizon):
            at, pid, seq = order.popleft()
            seen.discard((pid, seq))
            if at > now - FORWARD_MEMORY_MIN:  # (a resend after this could be published twice)
                self.metrics["forward_memory_short"] += 1
