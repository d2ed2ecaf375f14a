"""When a member dials each peer, at which address, and what it logs of its links (sans-IO).

Theory of operation
-------------------
Each member dials every peer it knows (cluster/links.py: the dialled link carries our
requests and heartbeats) and keeps at most one dialled link per peer. ``next_dial`` says when
the next dial to a peer is due: at once for a peer we learn of, ``reconnect_interval`` after
our link to it closed, never (``inf``) for a member whose leave is committed, except while it
may still be draining: it hears the cluster only through the heartbeats of the links we dial
(review, 2026-11-24, a leaver cut off once went deaf for good), so it is dialled again until
``leave_timeout + stop_timeout`` has passed (``redial_gone``, shared with cluster/joining.py,
which forgets a member that joins again) and then only if it dials us.

``was_up`` remembers whether our last link to a peer came up, so that a peer that stays out
of reach logs one ``link_down``, not one per failed dial. ``peer_addr`` is each known
member's peer address (a member that joins again may come back at another).

One component of :class:`cluster.member.MemberCore`: the link table, the member's list of
peers and set of known members, the members we have not reached (cluster/partitionmap.py) and
the action list are shared; the member says when links close and come up, and when dials are
due (its phase decides whether to dial at all).
"""

from __future__ import annotations

import math
from typing import Any

from roost.client import clustermap
from roost.cluster.config import ClusterSettings
from roost.cluster.events import Dial
from roost.cluster.links import Link, LinkTable
from roost.node.actions import Log


class Dialling:
    def __init__(self, s: ClusterSettings, peers: list[str], known: set[str], peer_addr: dict[str, clustermap.Addr],
                 left: set[str], unreached: set[str], redial_gone: dict[str, float], links: LinkTable,
                 actions: list[Any], now: float) -> None:  # fmt: skip
        self.s = s
        self.peers = peers  # (the member's list: it grows with joins)
        self.known = known  # (the member's set of every member id it knows, itself too)
        self.unreached = unreached  # (dialled, never reached: our view leaves them out)
        self.peer_addr = peer_addr  # every known member's peer address, ours too
        self.redial_gone = redial_gone  # departed peer -> dial it until then (cleared by a new join)
        self.lt = links
        self._out = actions
        self.was_up: dict[str, bool | None] = dict.fromkeys(peers)  # for link_up/link_down logs
        self.next_dial = {p: math.inf if p in left else now for p in peers}  # (never one that left)

    def _log(self, level: str, event: str, **fields: Any) -> None:
        self._out.append(Log(level, event, fields))

    def deadline(self) -> float:
        """The next dial due (to a peer we have no dialled link to)."""
        out, nd = self.lt.out, self.next_dial
        return min((nd[p] for p in self.peers if out[p] is None), default=math.inf)

    def due(self, now: float) -> None:
        """Dial every peer whose dial is due and that we have no dialled link to."""
        out = self.lt.out
        for p in self.peers:
            if out[p] is None and now >= self.next_dial[p]:
                self.dial(p, now)

    def dial(self, peer: str, now: float) -> None:
        lt = self.lt
        lid = lt.next_id
        lt.next_id += 1
        lt.links[lid] = Link(lid, True, peer, now + self.s.handshake_timeout)
        lt.out[peer] = lid
        self._out.append(Dial(lid, peer, self.peer_addr[peer]))

    def link_up(self, peer: str) -> None:
        """Our dialled link to ``peer`` completed its handshake."""
        self._log("info", "link_up", peer=peer)
        self.was_up[peer] = True

    def dropped(self, peer: str, was_up: bool, gone: bool, why: str, now: float) -> None:
        """Our dialled link to ``peer`` closed (``was_up``: after its handshake; ``gone``: the
        peer's leave is committed): when to dial it again."""
        s = self.s
        self.next_dial[peer] = now + s.reconnect_interval
        if gone and not was_up:
            until = self.redial_gone.setdefault(peer, now + s.leave_timeout + s.stop_timeout)
            if now >= until:
                self.next_dial[peer] = math.inf
        if self.was_up[peer] is not False:
            self._log("info", "link_down", peer=peer, reason=why)
        self.was_up[peer] = False

    def dial_back(self, peer: str, now: float) -> None:
        """A member that left and drains dialled us: dial it back, so that it hears our
        heartbeats (who is alive, our map) even when we restarted since its leave (simulator
        seed 9384)."""
        self.next_dial[peer] = now

    def add_peer(self, peer: str, addr: clustermap.Addr, left: bool, now: float) -> None:
        """A member we did not know: a peer, dialled at once (unreached until then), unless it
        left before we heard of it (it may dial us while it drains)."""
        self.peers.append(peer)
        self.known.add(peer)
        self.peer_addr[peer] = addr
        self.lt.out[peer] = None
        self.was_up[peer] = None
        self.next_dial[peer] = math.inf if left else now
        if not left:
            self.unreached.add(peer)

    def moved(self, peer: str, addr: clustermap.Addr) -> bool:
        """A member joined again at ``addr``: whether that is another address than it had."""
        if self.peer_addr[peer] == addr:
            return False
        self.peer_addr[peer] = addr
        return True

    def rejoined(self, peer: str, now: float) -> None:
        """A member that left joined again: dial it now if we had stopped dialling it (it is
        unreached until a link to it comes up)."""
        if self.lt.out[peer] is None and self.next_dial[peer] == math.inf:
            self.next_dial[peer] = now
            self.unreached.add(peer)
