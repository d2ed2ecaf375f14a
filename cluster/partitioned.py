"""A member in partitioned mode: its map, who gets which change, forwarding, held CMDACKs (sans-IO).

Theory of operation (docs/cluster.md, "Partitioned mode")
---------------------------------------------------------
Each member computes the cluster map (client/clustermap.py) from its own view:
the configured members, live unless its failure detector holds them ``down``
or they report ``syncing``; a member always counts itself live (while it syncs
it must accept the state of the partitions it is about to own). When the
owners change, the map gets a new epoch (past every epoch heard in
heartbeats), the broker core re-indexes (node/ownership.py) and:

* forwarded messages not yet acknowledged are routed again by the new map
  (everything, for a destination that is gone);
* what we hold of every partition with a new owner is pushed to its owners
  (hand-off: as its old owner, or as the home of clients with registers
  there), so no change stays behind on members that no longer own it;
* anti-entropy with the co-owners of every partition gained runs at once, so
  a new secondary is filled from the primary within one round.

Who gets a change: a subscription register goes to the owners of its
topic's partition, and the whole entry to the client's home (the member its
session talks to keeps all of its registers); a client register alone goes
to the owners of every partition the client has registers in.

Routing: a message for a partition another member is primary of leaves the
broker core as ``Forward`` and goes over our link to that member in FORWARD
frames (cluster/forwarding.py), acknowledged by FWDACK; fire messages are
sent once. Text datagrams for a text client whose home is another member go
there in a RELAY frame, to be sent from the address the client knows.

Held CMDACKs: a CMDACK (``Confirm``) leaves only once every peer link that
had pushes outstanding when it was made has acknowledged them, so the owners
hold the change before the client hears it is done; a peer whose link is
down does not hold it up, and ``down_after`` bounds the wait.

This is a mixin of :class:`cluster.member.MemberCore`, which owns the state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from roost.client import clustermap
from roost.cluster.memberparts import MemberParts

if TYPE_CHECKING:
    pass


class Partitioned(MemberParts):
    def _init_partitioned(self) -> None:
        s = self.s
        self.partitioned = s.mode == "partitioned"
        self.no_handoff = "no-handoff" in self.cfg.breaks  # (sim/breaks.py: a build that hands off nothing)
        if self.partitioned:
            self.broker.set_ownership(self.own)
            self._remap()

    # ------------------------------------------------------------ the map

    def _remap(self) -> None:
        """Compute the map of our current view (cluster/partitionmap.py); if its owners changed,
        hand off, route our forwards again, and tell the durable logs their owners."""
        moved = self.maps.remap(self.now)
        cmap = self.maps.cmap
        assert cmap is not None
        for peer, parts in self.pending.items():  # (a pending peer that now owns a partition gets it as owner)
            parts.difference_update(p for p in list(parts) if p < cmap.partitions and peer in cmap.owners[p])
        if moved is None:
            return
        old, gained = moved
        if gained:  # (clients of a member down long enough expire in the partitions we now own too)
            self.liveness.gained()
        if old is None:
            return
        self._hand_off({p for p in range(cmap.partitions) if set(cmap.owners[p]) - set(old.owners[p])}, old)
        for msgs in self.forwarding.to_route_again(cmap.live):
            self._reroute(msgs)
        self.durable.map_changed(old, self.now, self.ready)
        if gained and self.ready:
            for peer in self.peers:
                if any(peer in cmap.owners[p] for p in gained):
                    self.replicator.digest_soon(peer, self.now)

    def _hand_off(self, parts: set[int], old: clustermap.ClusterMap | None) -> None:
        """Each new owner of these partitions gets what we hold of them (as their old
        owner, or as the home of clients with registers there), so no change is left
        behind on a member that no longer owns it; merging is idempotent. Queued as
        a lazy dump per peer, taken as its push window opens (never built in one
        turn: review finding #9). ``old``: the map before (None: every owner is new)."""
        if self.no_handoff:
            return
        self.replicator.hand_off(self.maps.new_owners(parts, old))

    def _reroute(self, msgs: list[Any]) -> None:
        """Our own forwards, routed again by the current map."""
        if msgs:
            self._absorb(self.broker.forwarded(msgs, self.now, ours=True)[0])
