"""What ``roost status`` shows of a cluster member: its view of every member, the map, digests.

One component of :class:`cluster.member.MemberCore`: it reads the shared objects it is given
(the broker core, the failure detector's view, the links, the push queues, the roster, the map,
the roster work: which roster is committed, who has left) and the member passes what changes by
value (its phase, the time)."""

from __future__ import annotations

import hashlib
from typing import Any

from roost.cluster.config import ClusterConfig
from roost.cluster.joining import Joining
from roost.cluster.links import LinkTable
from roost.cluster.membership import Membership
from roost.cluster.partitionmap import PartitionMap
from roost.cluster.replication import PeerQueue
from roost.cluster.roster import Roster
from roost.node.core import BrokerCore


class MemberStatus:
    def __init__(self, cc: ClusterConfig, member_id: str, peers: list[str], broker: BrokerCore,
                 membership: Membership, links: LinkTable, queues: dict[str, PeerQueue], roster: Roster,
                 maps: PartitionMap, joins: Joining, last_synced: dict[str, float]) -> None:  # fmt: skip
        self.cc = cc
        self.id = member_id
        self.peers = peers  # (the member's list: it grows with joins)
        self.broker = broker
        self.membership = membership
        self.links = links
        self.queues = queues
        self.roster = roster
        self.maps = maps
        self.joins = joins
        self.last_synced = last_synced  # peer -> when a PULL from it or an anti-entropy round with it ended

    def status(self, phase: str, now: float) -> dict[str, Any]:
        """The cluster as this member sees it (``roost status``)."""
        left = {p for p in self.peers if self.maps.gone(p)}  # (the peers whose leave is committed here)
        committed = self.joins.committed
        members = []
        config = {m.id: m.advertised for m in self.cc.members}
        links = self.links
        for m in sorted([self.id, *self.peers]):
            e = self.roster.entries.get(m)  # (a member that left keeps the addresses it had)
            client = e.client if e is not None else config[m]
            addr = f"{client[0]}:{client[1]}"
            if m == self.id:
                members.append({"id": m, "state": phase, "subscriptions": self.broker.index.count,
                                "clients": self.broker.status()["clients"], "queue": 0,
                                "client_addr": addr})  # fmt: skip
                continue
            v = self.membership.peers[m]
            lid, synced = links.out[m], self.last_synced.get(m)
            members.append({"id": m, "state": "left" if m in left else v.state, "subscriptions": v.subscriptions,
                            "clients": v.clients, "queue": len(self.queues[m]),
                            "link": lid is not None and links.links[lid].up, "client_addr": addr,
                            # (seconds since a PULL from it or an anti-entropy round with it ended)
                            "last_sync_s": None if synced is None else round(now - synced, 3)})  # fmt: skip
        # (one hash of the 256 bucket digests: members that agree on every register show the same)
        digest = hashlib.blake2b(b"".join(d.to_bytes(8, "big") for d in self.broker.digest), digest_size=8)
        out: dict[str, Any] = {
            "state": phase,
            "mode": self.cc.settings.mode,
            "digest": digest.hexdigest(),
            "members": members,
            "roster": {"version": self.roster.version, "committed": committed == self.roster.digest()},
        }
        if self.maps.partitioned:
            out["map"] = self.maps.status()
            # (each partition's owners must agree: scripts/chaos.py compares them; 12 bytes each,
            # so up to 1,000 owned partitions fit a status datagram)
            own, d = self.maps.own.owned, self.broker.digest
            if sum(own) <= 1000:
                out["partition_digests"] = {str(p): d[p] for p in range(len(own)) if own[p]}
        return out
