"""A member's replication to its peers: who gets each change, the pushes, anti-entropy, held CMDACKs (sans-IO).

Theory of operation (docs/cluster.md, "Replication" and "Partitioned mode")
---------------------------------------------------------------------------
Every local SUB/UNSUB comes out of the broker core as a ``Replicate`` action; its entries go
into one PeerQueue per peer (cluster/replication.py) and are PUSHed on our link to that peer, a
window of frames in flight, each acknowledged by PUSHACK. A link that drops requeues what was in
flight. Partitioned mode sends each peer only its part (``route``): a subscription register goes
to the owners of its topic's partition (and to peers pulling that partition from us), the whole
entry to the client's home, and the client register alone to every other member (a member may
hold registers of the client that this one does not know of). Nothing goes to a member whose
leave is committed.

Anti-entropy: every ``anti_entropy_interval``, on our link to each ready peer, we send our 256
bucket digests (DIGEST); the peer answers with its entries of the buckets that differ (DIFF ...
DIFFEND, merged by the member) and we push ours of the same buckets, made as the push window
opens. A queue that overflowed is repaired this way at once.

Hand-off (partitioned): what we hold of a partition with a new owner is queued to that owner as
a lazy dump, after any repair.

Held CMDACKs (partitioned): a CMDACK (``Confirm``) leaves only once every peer link that had
pushes outstanding when it was made has acknowledged them, so the owners hold the change before
the client hears it is done; a peer whose link is down does not hold it up, and ``down_after``
bounds the wait.

One component of :class:`cluster.member.MemberCore`: the links, the map, the broker core, the
failure detector's view, the peers pulling from us (``pending``, cluster/joining.py) and the
action list are shared with the member.
"""

from __future__ import annotations

import math
from typing import Any

from roost.client.clustermap import ClusterMap
from roost.cluster.config import ClusterSettings
from roost.cluster.links import LinkTable
from roost.cluster.membership import Membership
from roost.cluster.partitionmap import PartitionMap
from roost.cluster.peerwire import PeerProtocolError, PeerType, encode
from roost.cluster.replication import PeerQueue
from roost.node.actions import Log, Send
from roost.node.core import BrokerCore


class Replicator:
    def __init__(self, member_id: str, s: ClusterSettings, peers: list[str], broker: BrokerCore, links: LinkTable,
                 maps: PartitionMap, membership: Membership, pending: dict[str, set[int]], actions: list[Any],
                 no_handoff: bool = False) -> None:  # fmt: skip
        self.id = member_id
        self.s = s
        self.partitioned = s.mode == "partitioned"
        self.peers = peers  # (the member's list: it grows with joins)
        self.broker = broker
        self.links = links
        self.maps = maps
        self.membership = membership
        self.pending = pending  # peer -> partitions it pulled from us: it gets their changes
        self._out = actions
        self.no_handoff = no_handoff  # (sim/breaks.py "no-handoff": a build that hands off nothing)
        self.queues = {p: PeerQueue(s.max_peer_queue, s.chunk_subscriptions) for p in peers}
        self.next_digest = dict.fromkeys(peers, math.inf)
        self.digest_pending: set[str] = set()  # peers our DIGEST went to, its DIFFEND not yet back
        self.last_synced: dict[str, float] = {}  # peer -> when a PULL from it or an anti-entropy round with it ended
        self.held: list[tuple[float, dict[str, int], Send]] = []  # (give up at, peer -> entry number, CMDACK)

    # ------------------------------------------------------------ peers come and go

    def add_peer(self, peer: str) -> None:
        self.queues[peer] = PeerQueue(self.s.max_peer_queue, self.s.chunk_subscriptions)
        self.next_digest[peer] = math.inf

    def rejoined(self, peer: str, now: float) -> None:
        """A member that left joined again: push and repair again (its queue was cleared)."""
        self.queues[peer] = PeerQueue(self.s.max_peer_queue, self.s.chunk_subscriptions)
        self.next_digest[peer] = now + self.s.anti_entropy_interval

    def left(self, peer: str) -> None:
        """Its leave is committed: no more pushes (it owns nothing), no anti-entropy."""
        self.queues[peer].clear()
        self.next_digest[peer] = math.inf

    def link_up(self, peer: str, now: float) -> None:
        q = self.queues[peer]
        self.next_digest[peer] = now if q.overflowed else now + self.s.anti_entropy_interval
        self.pump(peer)

    def disconnected(self, peer: str) -> None:
        self.queues[peer].disconnected()
        self.digest_pending.discard(peer)

    def ready(self, now: float) -> None:
        """The member is ready: anti-entropy with every peer from now on."""
        for p in self.peers:
            self.next_digest[p] = now + self.s.anti_entropy_interval

    def gained(self, gained: set[int], cmap: ClusterMap, now: float) -> None:
        """We gained partitions: anti-entropy at once with their co-owners (a new secondary is
        filled from the primary within one round)."""
        for peer in self.peers:
            if any(peer in cmap.owners[p] for p in gained):
                self.next_digest[peer] = now

    def synced(self, peer: str, now: float) -> None:
        """A PULL from ``peer`` ended (``roost status`` shows when)."""
        self.last_synced[peer] = now

    def drained(self, peer: str) -> bool:
        """Everything we owe ``peer`` is acknowledged (stopping waits for it)."""
        q = self.queues[peer]
        return not q.pending and not q.inflight and q.repair is None and q.handoff is None

    # ------------------------------------------------------------ pushes

    def distribute(self, entries: list[Any]) -> None:
        """A ``Replicate``: each peer's part of the entries, queued and pushed."""
        queues = self.queues
        if self.partitioned:
            for peer, mine in self.route(entries).items():
                queues[peer].add(mine)
                self.pump(peer)
            return
        gone = self.maps.gone
        for peer, q in queues.items():
            if not gone(peer):
                q.add(entries)
                self.pump(peer)

    def pump(self, peer: str) -> None:
        """PUSH frames to ``peer`` as its window allows, if our link to it is up."""
        lid = self.links.up(peer)
        if lid is None:
            return
        q, frame = self.queues[peer], self.links.frame
        while (push := q.next_push()) is not None:
            frame(lid, encode([PeerType.PUSH, push[0], push[1]]))

    def acked(self, peer: str, seq: Any) -> None:
        """A PUSHACK."""
        if seq.__class__ is not int:
            raise PeerProtocolError("malformed PUSHACK")
        self.queues[peer].acked(seq)
        self.pump(peer)

    def hand_off(self, per: dict[str, set[int]], ours: bool = False) -> None:
        """Each new owner gets what we hold of its new partitions (cluster/partitionmap.py
        ``new_owners``), queued as a lazy dump per peer, taken as its push window opens (never
        built in one turn: review finding #9); merging is idempotent. ``ours``: only the
        registers of the clients whose home we are."""
        if self.no_handoff:
            return
        for peer, mine in per.items():
            self.queues[peer].add_handoff(self.broker.dump(mine, ours=ours))
            self.pump(peer)

    def route(self, entries: list[Any]) -> dict[str, list[Any]]:
        """Per peer, the part of each replication entry it keeps (partitioned mode)."""
        maps = self.maps
        assert maps.cmap is not None
        owners, part, me, gone = maps.owners_of, maps.own.partition, self.id, maps.gone
        clients = self.broker.clients
        staying = [m for m in self.peers if not gone(m)]  # (none to a member that left)
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
                        if p in parts and m not in owners(p) and not gone(m):
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
            if home != me and home in self.queues and not gone(home):
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

    # ------------------------------------------------------------ anti-entropy

    def digests_due(self, now: float) -> None:
        """Our DIGEST to every peer whose round is due (members only)."""
        gone = self.maps.gone
        for p in self.peers:
            if now >= self.next_digest[p] and p not in self.digest_pending:
                if gone(p):  # (anti-entropy with members only)
                    self.next_digest[p] = math.inf
                else:
                    self._send_digest(p, now)

    def _send_digest(self, peer: str, now: float) -> None:
        lid = self.links.up(peer)
        if lid is None or self.membership.peers[peer].state != "ready":
            self.next_digest[peer] = now + self.s.anti_entropy_interval
            return
        self.digest_pending.add(peer)
        self.links.frame(lid, encode([PeerType.DIGEST, list(self.broker.digest)]))

    def diffend(self, peer: str, buckets: Any, now: float) -> None:
        """DIFFEND: the peer sent its side of the buckets that differ; ours goes back as pushes,
        made as the push window opens (never all in one turn)."""
        if buckets.__class__ is not list or not all(b.__class__ is int for b in buckets):
            raise PeerProtocolError("malformed DIFFEND")
        q = self.queues[peer]
        q.repaired()  # (first: an overflowed queue would drop what follows)
        if buckets:
            if not self.maps.gone(peer):  # (a digest in flight when its leave was committed)
                q.add_repair(self.broker.dump(set(buckets)))
            self._out.append(Log("info", "anti_entropy", {"peer": peer, "buckets": len(buckets)}))
        self.digest_pending.discard(peer)
        self.next_digest[peer] = now + self.s.anti_entropy_interval
        self.last_synced[peer] = now
        self.pump(peer)

    def deadline(self, ready: bool) -> float:
        """The next digest round due on a link we dialled (ready only), and the next held CMDACK
        to give up on."""
        d = math.inf
        if ready:
            out, pending = self.links.out, self.digest_pending
            for p in self.peers:
                if out[p] is not None and p not in pending:
                    d = min(d, self.next_digest[p])
        for held in self.held:
            d = min(d, held[0])
        return d

    # ------------------------------------------------------------ held CMDACKs

    def hold(self, confirms: list[Send], now: float) -> None:
        up = self.links.up
        waits = {p: q.added for p, q in self.queues.items() if q.acked_through < q.added and up(p) is not None}
        if not waits:
            self._out.extend(confirms)
            return
        until = now + self.s.down_after
        self.held.extend((until, waits, c) for c in confirms)

    def release_held(self, now: float) -> None:
        if not self.held:
            return
        keep = []
        queues, up = self.queues, self.links.up
        for until, waits, send in self.held:
            if now >= until or all(queues[p].acked_through >= n or up(p) is None for p, n in waits.items()):
                self._out.append(send)
            else:
                keep.append((until, waits, send))
        self.held = keep

    def paused(self, stood: float) -> None:
        """Our loop stood still: the PUSHACKs that wait unread do not count against a held CMDACK."""
        self.held = [(until + stood, waits, confirm) for until, waits, confirm in self.held]
