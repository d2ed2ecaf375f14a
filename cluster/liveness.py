"""A member's view of its peers' liveness (sans-IO): the clients of members dead for good expired.

Theory of operation (docs/cluster.md, "Failure detection")
-----------------------------------------------------------
cluster/membership.py turns heartbeats into peer states; the member acts on its verdicts (a
state change closes the link to a peer gone ``down``, which may be a dead TCP connection, drops
what it had pulled from us, moves the map in partitioned mode and re-checks a roster not yet
committed). A peer down longer than ``subscriber_timeout`` takes its clients' subscriptions with
it: :class:`Liveness` decides when, and keeps which peers' clients are expired already.

A pause of our own loop (a long core call, SIGSTOP, a VM pause) is no silence of our peers:
what they sent meanwhile is unread in the kernel, so the member credits their silence and its
deadlines with it (Cassandra's failure detector ignores a local pause the same way).

One component of :class:`cluster.member.MemberCore`: the broker core, the failure detector,
the member's list of peers, the links, the components whose deadlines a pause moves and the
action list are shared; the broker's actions and the links to close are returned for the member
to act on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from roost.cluster.durable import DurableLogs
from roost.cluster.lifecycle import Lifecycle
from roost.cluster.links import LinkTable
from roost.cluster.membership import Membership
from roost.cluster.replicator import Replicator
from roost.node.actions import Log
from roost.node.config import NodeConfig
from roost.node.core import BrokerCore


class Liveness:
    def __init__(self, member_id: str, cfg: NodeConfig, heartbeat_interval: float, partitioned: bool,
                 broker: BrokerCore, membership: Membership, peers: list[str], links: LinkTable,
                 pending: dict[str, set[int]], life: Lifecycle, replicator: Replicator, durable: DurableLogs,
                 actions: list[Any]) -> None:  # fmt: skip
        self.id = member_id
        self.cfg = cfg
        self.heartbeat_interval = heartbeat_interval  # (the member is called at least this often)
        self.partitioned = partitioned
        self.broker = broker
        self.membership = membership
        self.peers = peers  # (the member's list: it grows with joins)
        self.lt = links
        self.pending = pending  # peer -> partitions it pulled from us (cluster/joining.py)
        self.life = life
        self.replicator = replicator
        self.durable = durable
        self._out = actions
        self.expired: set[str] = set()  # peers whose clients we expired (until they come back)
        self.expire_again: dict[str, float] = {}  # peer -> when to look again (clients alive elsewhere)

    def paused(self, stood: float, now: float, log: bool) -> None:
        """Our loop stood still for ``stood`` seconds more than it may (a long core call,
        SIGSTOP, a VM pause, a slow snapshot read): what peers sent meanwhile waits unread in the
        kernel, so their silence and our deadlines are credited with the pause. Without it one
        stall past ``down_after`` takes every peer down at once and remaps to owning everything,
        which stalls again."""
        self.membership.credit(stood, now)
        for link in self.lt.links.values():
            link.deadline += stood
        self.life.paused(stood)
        self.replicator.paused(stood)  # (PUSHACKs unread)
        self.durable.paused(now)
        if log:
            self._out.append(Log("warning", "local_pause", {"seconds": round(stood + self.heartbeat_interval, 3)}))

    def watch(self, now: float) -> tuple[bool, Iterator[int]]:
        """The failure detector's verdicts (cluster/membership.py): whether a peer's state
        changed, and the links the member closes, each as its change is logged: a peer gone down
        has its link closed (it may be a dead TCP connection), then what it pulled from us is
        dropped."""
        changes = self.membership.tick(now)
        return bool(changes), self._verdicts(changes)

    def _verdicts(self, changes: list[tuple[str, str, str]]) -> Iterator[int]:
        for peer, old, new in changes:
            self._out.append(Log("warning" if new == "down" else "info", "peer_state",
                                 {"peer": peer, "old": old, "new": new}))  # fmt: skip
            lid = self.lt.out[peer]
            if new == "down" and lid is not None:
                yield lid
        for peer, _old, new in changes:
            if new == "down":
                self.pending.pop(peer, None)

    def heard(self, peer: str) -> None:
        """The peer's state changed: its clients may expire again once it is down long enough."""
        self.expired.discard(peer)

    def gained(self) -> None:
        """We own new partitions: clients of a member down long enough expire in them too."""
        self.expired.clear()

    def expire_lost_homes(self, now: float) -> list[list[Any]]:
        """A member down for longer than subscriber_timeout takes its clients' subscriptions
        with it; one surviving member (the lowest ready id) writes the tombstones, which
        replicate like any change. Returns the broker core's actions, one list per peer, for
        the member to pass on in that order."""
        ready = [self.id] + [p for p, v in self.membership.peers.items() if v.state == "ready"]
        if min(ready) != self.id and not self.partitioned:  # (partitioned: each primary its own)
            return []
        out = []
        timeout = self.cfg.subscriber_timeout
        for peer in self.peers:
            if peer not in self.expired and self.membership.down_for(peer, now) > timeout \
                    and now >= self.expire_again.get(peer, 0.0):  # fmt: skip
                out.append(self.broker.expire_home(peer, now))
                if self.broker.expire_skipped:  # clients alive elsewhere: look again in a while
                    self.expire_again[peer] = now + timeout / 2
                else:
                    self.expired.add(peer)
        return out
