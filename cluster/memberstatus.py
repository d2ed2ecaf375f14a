"""What ``roost status`` shows of a cluster member: its view of every member, the map, digests (mixin)."""

from __future__ import annotations

import hashlib
from typing import Any

from roost.cluster.memberparts import MemberParts


class MemberStatus(MemberParts):
    def status(self) -> dict[str, Any]:
        """The cluster as this member sees it (``roost status``)."""
        members = []
        config = {m.id: m.advertised for m in self.cc.members}
        for m in sorted([self.id, *self.peers]):
            e = self.roster.entries.get(m)  # (a member that left keeps the addresses it had)
            client = e.client if e is not None else config[m]
            addr = f"{client[0]}:{client[1]}"
            if m == self.id:
                members.append({"id": m, "state": self.phase, "subscriptions": self.broker.index.count,
                                "clients": self.broker.status()["clients"], "queue": 0,
                                "client_addr": addr})  # fmt: skip
                continue
            v = self.membership.peers[m]
            lid, synced = self.out[m], self.last_synced.get(m)
            members.append({"id": m, "state": "left" if self._gone(m) else v.state, "subscriptions": v.subscriptions,
                            "clients": v.clients, "queue": len(self.queues[m]),
                            "link": lid is not None and self.links[lid].up, "client_addr": addr,
                            # (seconds since a PULL from it or an anti-entropy round with it ended)
                            "last_sync_s": None if synced is None else round(self.now - synced, 3)})  # fmt: skip
        # (one hash of the 256 bucket digests: members that agree on every register show the same)
        digest = hashlib.blake2b(b"".join(d.to_bytes(8, "big") for d in self.broker.digest), digest_size=8)
        out: dict[str, Any] = {
            "state": self.phase,
            "mode": self.s.mode,
            "digest": digest.hexdigest(),
            "members": members,
            "roster": {"version": self.roster.version, "committed": self.committed == self.roster.digest()},
        }
        if self.partitioned:
            out["map"] = self.maps.status()
            # (each partition's owners must agree: scripts/chaos.py compares them; 12 bytes each,
            # so up to 1,000 owned partitions fit a status datagram)
            own, d = self.own.owned, self.broker.digest
            if sum(own) <= 1000:
                out["partition_digests"] = {str(p): d[p] for p in range(len(own)) if own[p]}
        return out
