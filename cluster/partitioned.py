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
from roost.cluster.forwarding import ForwardQueue
from roost.cluster.memberparts import MemberParts
from roost.cluster.peerwire import PeerProtocolError, PeerType, check_forwarded_untrusted, check_relay_untrusted, encode

if TYPE_CHECKING:
    from roost.cluster.links import Link


class Partitioned(MemberParts):
    def _init_partitioned(self) -> None:
        s = self.s
        self.partitioned = s.mode == "partitioned"
        self.no_handoff = "no-handoff" in self.cfg.breaks  # (sim/breaks.py: a build that hands off nothing)
        self.fwd: dict[str, ForwardQueue] = {p: ForwardQueue(s.max_forward_queue, s.max_frame // 2) for p in self.peers}
        self.held: list[tuple[float, dict[str, int], Send]] = []  # (give up at, peer -> entry number, CMDACK)
        # Reliable messages with no live owner in our map (a leaver that hears no placed member):
        # kept unacknowledged and routed again at the next map change (review, 2026-11-24: they were
        # delivered here, to nobody, and acknowledged)
        self.unrouted: list[Any] = []
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
        for peer, q in self.fwd.items():
            self._reroute(q.take(everything=peer not in cmap.live))
        self._route_unrouted()
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

    # ------------------------------------------------------------ forwarding and relaying

    def _forward(self, member: str, msgs: list[Any]) -> None:
        if member == "":  # (no live owner)
            reliable = [m for m in msgs if m[4] is not None]
            self.broker.metrics["forward_dropped"] += len(msgs) - len(reliable)
            room = max(0, self.s.max_forward_queue - len(self.unrouted))
            self.unrouted.extend(reliable[:room])
            if reliable[room:]:
                self.broker.metrics["forward_overflow"] += len(reliable) - room
                self._absorb(self.broker.settle_forwards(reliable[room:], self.now))  # (given up)
            return
        q = self.fwd.get(member)
        if q is None:
            self.broker.metrics["forward_dropped"] += len(msgs)
            self._absorb(self.broker.settle_forwards(msgs, self.now))  # (given up)
            return
        fire = [m for m in msgs if m[4] is None]
        if fire:
            lid = self.out[member]
            if lid is not None and self.links[lid].up:
                self.lt.frame(lid, encode([PeerType.FORWARD, 0, fire]))
            else:
                self.broker.metrics["forward_dropped"] += len(fire)
        if len(fire) < len(msgs):
            dropped = q.add([m for m in msgs if m[4] is not None])
            if dropped:
                self.broker.metrics["forward_overflow"] += len(dropped)
                self._log("warning", "forward_overflow", peer=member, dropped=len(dropped))
                self._absorb(self.broker.settle_forwards(dropped, self.now))  # (given up)
            self._pump_forwards(member)

    def _pump_forwards(self, peer: str) -> None:
        if not self._peer_link_up(peer):
            return
        lid = self.out[peer]
        assert lid is not None
        q = self.fwd[peer]
        frame = self.lt.frame
        while (f := q.next_frame()) is not None:
            fid, msgs = f
            frame(lid, encode([PeerType.FORWARD, fid, msgs]))

    def _reroute(self, msgs: list[Any]) -> None:
        """Our own forwards, routed again by the current map."""
        if msgs:
            self._absorb(self.broker.forwarded(msgs, self.now, ours=True)[0])

    def _retry_refused(self) -> None:
        """Every heartbeat: messages a peer refused (its map differed) are routed again, ahead
        of the newer ones still queued."""
        for q in self.fwd.values():
            if q.parked:
                self._reroute(q.take(everything=False))

    def _route_unrouted(self) -> None:
        if self.unrouted:
            msgs, self.unrouted = self.unrouted, []
            self._reroute(msgs)

    def _relay(self, member: str, sends: list[Any]) -> None:
        lid = self.out.get(member)
        if lid is not None and self.links[lid].up:
            self.lt.frame(lid, encode([PeerType.RELAY, sends]))
        else:
            self.broker.metrics["relay_dropped"] += len(sends)

    def _on_forward_frame(self, link: Link, fid: Any, msgs: Any) -> None:
        if fid.__class__ is not int or not 0 <= fid < 2**63:
            raise PeerProtocolError("malformed FORWARD")
        actions, refused = self.broker.forwarded(check_forwarded_untrusted(msgs), self.now)
        self._absorb(actions)
        if fid:  # (fire messages refused are dropped: at most once)
            self.lt.frame(link.id, encode([PeerType.FWDACK, fid, refused]))

    def _on_fwdack(self, peer: str, fid: Any, refused: Any) -> None:
        if fid.__class__ is not int or refused.__class__ is not list \
                or not all(i.__class__ is int and 0 <= i < 65536 for i in refused):  # fmt: skip
            raise PeerProtocolError("malformed FWDACK")
        delivered = self.fwd[peer].acked(fid, refused)
        if delivered:
            self._absorb(self.broker.settle_forwards(delivered, self.now))
        self._pump_forwards(peer)

    def _on_relay_frame(self, sends: Any) -> None:
        clients = self.broker.clients
        for addr, data in check_relay_untrusted(sends):
            c = clients.get(addr)
            if c is not None and c.local:
                if self.broker.text_budget(c, len(data)):
                    self._out.append(Send(addr, data))
            else:
                self.broker.metrics["relay_refused"] += 1
