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
from roost.cluster.events import Send
from roost.cluster.memberparts import MemberParts

if TYPE_CHECKING:
    pass


class Partitioned(MemberParts):
    def _init_partitioned(self) -> None:
        s = self.s
        self.partitioned = s.mode == "partitioned"
        self.no_handoff = "no-handoff" in self.cfg.breaks  # (sim/breaks.py: a build that hands off nothing)
        self.held: list[tuple[float, dict[str, int], Send]] = []  # (give up at, peer -> entry number, CMDACK)
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
                    self.next_digest[peer] = self.now

    def _hand_off(self, parts: set[int], old: clustermap.ClusterMap | None) -> None:
        """Each new owner of these partitions gets what we hold of them (as their old
        owner, or as the home of clients with registers there), so no change is left
        behind on a member that no longer owns it; merging is idempotent. Queued as
        a lazy dump per peer, taken as its push window opens (never built in one
        turn: review finding #9). ``old``: the map before (None: every owner is new)."""
        if self.no_handoff:
            return
        for peer, mine in self.maps.new_owners(parts, old).items():
            self.queues[peer].add_handoff(self.broker.dump(mine))
            self._pump_pushes(peer)

    # ------------------------------------------------------------ who gets a change

    def _route_entries(self, entries: list[Any]) -> dict[str, list[Any]]:
        """Per peer, the part of each replication entry it keeps."""
        assert self.maps.cmap is not None
        owners, part, me = self.maps.owners_of, self.own.partition, self.id
        clients = self.broker.clients
        staying = [m for m in self.peers if not self._gone(m)]  # (none to a member that left)
        per: dict[str, list[Any]] = {}
        for e in entries:
            home, subs = e[4], e[5]
            if subs:
                targets: dict[str, list[Any]] = {}
                for sub in subs:
                    p = part(sub[0])
                    for m in owners(p):
                        if m != me:
                            targets.setdefault(m, []).append(sub)
                    for m, parts in self.pending.items():  # (peers pulling it: cluster/joining.py)
                        if p in parts and m not in owners(p) and not self._gone(m):
                            targets.setdefault(m, []).append(sub)
                for m, mine in targets.items():
                    if m != home:
                        per.setdefault(m, []).append(e if len(mine) == len(subs) else [*e[:5], mine, e[6]])
            else:  # the client register alone: wherever its registers are
                who = e[0] if e[0].__class__ is bytes else tuple(e[0])
                c = clients.get(who)
                for m in dict.fromkeys(m for tk in (c.subs if c is not None else ()) for m in owners(part(tk[0]))):
                    if m != me and m != home:
                        per.setdefault(m, []).append(e)
            if home != me and home in self.queues and not self._gone(home):
                per.setdefault(home, []).append(e)
            # The client register goes to everyone else: a member may hold registers of the
            # client that this one does not know of (subscribed through another home), and
            # needs its address, home and resets (node/registers.py, _void_older).
            bare = None
            for m in staying:
                got = per.get(m)
                if not got or (got[-1] is not e and got[-1][0] is not e[0]):
                    if bare is None:
                        bare = [*e[:5], [], e[6]]
                    per.setdefault(m, []).append(bare)
        return per

    # ------------------------------------------------------------ held CMDACKs

    def _hold(self, confirms: list[Send]) -> None:
        waits = {p: q.added for p, q in self.queues.items() if q.acked_through < q.added and self._peer_link_up(p)}
        if not waits:
            self._out.extend(confirms)
            return
        until = self.now + self.s.down_after
        self.held.extend((until, waits, c) for c in confirms)

    def _release_held(self) -> None:
        if not self.held:
            return
        keep = []
        for until, waits, send in self.held:
            if self.now >= until or all(self.queues[p].acked_through >= n or not self._peer_link_up(p)
                                        for p, n in waits.items()):  # fmt: skip
                self._out.append(send)
            else:
                keep.append((until, waits, send))
        self.held = keep

    def _peer_link_up(self, peer: str) -> bool:
        lid = self.out[peer]
        return lid is not None and self.links[lid].up

    def _reroute(self, msgs: list[Any]) -> None:
        """Our own forwards, routed again by the current map."""
        if msgs:
            self._absorb(self.broker.forwarded(msgs, self.now, ours=True)[0])
