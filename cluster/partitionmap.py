"""A member's cluster map in partitioned mode: its view of who is live, and who owns which partition (sans-IO).

Theory of operation (docs/cluster.md, "Partitioned mode")
---------------------------------------------------------
Each member computes the cluster map (client/clustermap.py) from its own view:
the members of the committed roster (``placed``), live unless its failure
detector holds them ``down`` or they report ``syncing``; a member always counts
itself live (while it syncs it must accept the state of the partitions it is
about to own). A peer not heard from since we started counts live until a dial
to it fails (``unreached``).

When the owners change, :meth:`PartitionMap.remap` installs the map with a new
epoch (past every epoch heard in heartbeats), tells the broker core (its map
for clients, and the re-index of node/ownership.py) and returns the map before
and the partitions gained: what follows a change (hand-off, forwards routed
again, the durable logs' owners, anti-entropy) is the member's to do with its
other components. A change of the live set alone keeps the epoch.

This is one component of :class:`cluster.member.MemberCore`; the broker core,
the failure detector's view and the action list are shared with the member.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from roost.client import clustermap
from roost.cluster.config import ClusterSettings
from roost.cluster.membership import Membership
from roost.cluster.roster import Roster
from roost.node.actions import Log
from roost.node.core import BrokerCore
from roost.node.ownership import Ownership


class PartitionMap:
    def __init__(self, member_id: str, s: ClusterSettings, broker: BrokerCore, membership: Membership,
                 roster: Roster, actions: list[Any]) -> None:  # fmt: skip
        self.id = member_id
        self.s = s
        self.partitioned = s.mode == "partitioned"
        self.broker = broker
        self.membership = membership
        self.actions = actions
        self.own = Ownership(member_id, s.partitions)
        self.cmap: clustermap.ClusterMap | None = None
        self.epoch_seen = 0
        self.roster = roster
        self.placed = roster.members()  # the members of the committed roster (cluster/joining.py commits)
        # Peers never heard from since we started whose dial failed: not live (review finding #4)
        self.unreached: set[str] = set()

    def live_view(self) -> set[str]:
        """Members this one counts live: itself, and every peer neither down nor syncing.

        A peer not heard from since we started counts live (so a cluster that starts
        together has its full map at once) until a dial to it fails: a member that
        restarts while another is down must not take the dead one for an owner for
        ``down_after`` (it would PULL the wrong partitions, refuse the hand-offs meant
        for it and forward to the dead one)."""
        live = {self.id}
        for p, v in self.membership.peers.items():
            if v.state != "down" and v.reported != "syncing" and p not in self.unreached:
                live.add(p)
        return live

    def dial_failed(self, peer: str) -> bool:
        """A link we dialled closed before its handshake completed: whether our view changed."""
        if self.partitioned and self.membership.peers[peer].state == "unknown" and peer not in self.unreached:
            self.unreached.add(peer)
            return True
        return False

    def remap(self, now: float) -> tuple[clustermap.ClusterMap | None, set[int]] | None:
        """Compute the map of our current view and install it if its owners changed: returns
        (the map before, the partitions we gained), or None if the owners are the same."""
        new = clustermap.compute(0, self.placed, self.live_view(), self.s.partitions, self.s.replicas)
        old = self.cmap
        if old is not None and new.owners == old.owners:
            if new.live != old.live:
                self.cmap = dataclasses.replace(new, epoch=old.epoch)
                self.broker.set_cluster_map(clustermap.encode(self.cmap), self.cmap.epoch)  # (for clients)
            return None
        epoch = max(self.epoch_seen, old.epoch if old is not None else 0) + 1
        self.epoch_seen = epoch
        self.cmap = cmap = dataclasses.replace(new, epoch=epoch)
        self.broker.set_cluster_map(clustermap.encode(cmap), epoch)  # (WELCOME, REDIRECT carry it)
        gained, lost = self.own.update(epoch, cmap.owners)
        self.broker.reindex(gained, lost, now)
        primaries = sum(1 for o in cmap.owners if o and o[0] == self.id)
        self.actions.append(Log("info", "map_changed", {"epoch": epoch, "live": len(cmap.live), "primary": primaries,
                                "owned": sum(self.own.owned), "gained": len(gained), "lost": len(lost)}))  # fmt: skip
        return old, gained

    def gone(self, peer: str) -> bool:
        """A member whose leave is committed here."""
        return peer not in self.placed and self.roster.left(peer)

    def heard_epoch(self, epoch: int) -> None:
        if epoch > self.epoch_seen:
            self.epoch_seen = epoch

    def shared(self, peer: str) -> list[int]:
        """Partitions both this member and ``peer`` own in our map (the spanning one too)."""
        assert self.cmap is not None
        return [p for p, o in enumerate(self.cmap.owners) if self.id in o and peer in o] + [self.own.spanning]

    def owners_of(self, p: int) -> tuple[str, ...]:
        """Who keeps the registers of partition ``p``: its owners, or for the spanning
        partition (wildcard subscriptions) every member of the map."""
        assert self.cmap is not None
        if p < len(self.cmap.owners):
            return self.cmap.owners[p]
        return tuple(self.cmap.members)

    def moved(self, old: clustermap.ClusterMap) -> set[int]:
        """The partitions with an owner now that they did not have in ``old``."""
        assert self.cmap is not None
        owners = self.cmap.owners
        return {p for p in range(self.cmap.partitions) if set(owners[p]) - set(old.owners[p])}

    def new_owners(self, parts: set[int], old: clustermap.ClusterMap | None) -> dict[str, set[int]]:
        """Per peer, those of ``parts`` it owns now and did not in ``old`` (None: every owner is new)."""
        assert self.cmap is not None
        owners = self.cmap.owners
        per: dict[str, set[int]] = {}
        for p in parts:
            for m in owners[p]:
                if m != self.id and (old is None or m not in old.owners[p]):
                    per.setdefault(m, set()).add(p)
        return per

    def status(self) -> dict[str, Any]:
        cmap = self.cmap
        if cmap is None:
            return {}
        return {"epoch": cmap.epoch, "partitions": cmap.partitions, "replicas": cmap.replicas,
                "live": sorted(cmap.live), "owned": sum(self.own.owned),
                "primary": sum(1 for o in cmap.owners if o and o[0] == self.id),
                "unowned": sum(1 for o in cmap.owners if not o)}  # fmt: skip
