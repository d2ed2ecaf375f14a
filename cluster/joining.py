"""A member's side of dynamic membership: the roster, joins, leaves, and when the map moves (sans-IO).

Theory of operation (docs/cluster.md, "Partitioned mode: joins and leaves")
---------------------------------------------------------------------------
The roster (cluster/roster.py) says which members the cluster has; the map is computed from
the *committed* roster, which may lag the latest one this member knows. A change moves the map
only once every member that will own new partitions holds them, so no partition is ever served
by a member without its state (Kafka reassigns the same way: new replicas catch up, then the
leadership moves):

1. A change arrives: an admin JOIN or LEAVE (``roost cluster join``/``leave``, over an
   authenticated peer link, cluster/admin.py) makes a new entry, or a ROSTER frame from a peer
   brings one. Every ROSTER change goes to every peer at once, and each link that comes up
   starts with our whole roster, so members that were away learn it.
2. Each member computes the *target* map (latest roster, its live view). The partitions it owns
   there but holds no state of are its *gains*: it PULLs them (``PULL [partitions]``) from the
   current owners. A member answering such a PULL pushes every later change of those partitions
   to the puller as well (``pending``), so nothing made between the dump and the move is
   missed.
3. A member that holds all it owns in the target map reports the latest roster's digest as
   *synced* in its heartbeats. When it and every live, ready peer report the latest digest, it
   commits: the map is computed from the latest roster (a new epoch; hand-off to new owners as on
   any map change, the member's _remap).
4. A member whose own leave is committed owns nothing; it keeps delivering what its mailboxes
   hold, and stops once they are empty (or ``leave_timeout`` passed) and its queues drained.
   Members send a member whose leave is committed no more pushes; they keep their link to it
   while it drains (and let it dial them), and stop dialling it once a dial fails.

A member that is still syncing (starting up) is in no one's map, so it commits every roster at
once and pulls what it owns in it before it reports ready.

The member routes to :class:`Joining` (a plain component) the ROSTER frames, the admin
requests and its timers; it answers with what the member must do with its other components
(members to add or dial again, a commit, gains to pull, stop). The roster, the map, the failure
detector's view, the broker core, the links and the action list are shared with the member.
"""

from __future__ import annotations

import math
from typing import Any

from roost.client import clustermap
from roost.client.wire import WireError, _ip, _port
from roost.cluster.config import ClusterSettings
from roost.cluster.links import LinkTable
from roost.cluster.membership import Membership
from roost.cluster.partitionmap import PartitionMap
from roost.cluster.peerwire import ADMIN, PeerProtocolError, PeerType, encode
from roost.cluster.roster import MEMBER_ID, Roster, RosterError, decode_untrusted_roster
from roost.node.actions import Log
from roost.node.core import BrokerCore


class Joining:
    def __init__(self, member_id: str, s: ClusterSettings, roster: Roster, known: set[str], maps: PartitionMap,
                 membership: Membership, broker: BrokerCore, links: LinkTable, actions: list[Any]) -> None:  # fmt: skip
        self.id = member_id
        self.s = s
        self.partitioned = s.mode == "partitioned"
        self.roster = roster
        self.known = known  # (the member's set of every member id it knows, itself too)
        self.maps = maps
        self.membership = membership
        self.broker = broker
        self.links = links
        self._out = actions
        self.committed = roster.digest()  # the roster the map is computed from
        self.synced = self.committed  # the latest roster whose gains we hold
        self.pulled: set[int] = set()  # gains pulled for the roster being committed
        self.pending: dict[str, set[int]] = {}  # peer -> partitions it pulled from us: it gets their changes
        self.leave_by = math.inf  # our leave is committed: stop by then at the latest
        # Peers our latest roster went to, on a link we dialled that was up (a leaver waits for the rest)
        self.told: set[str] = set()
        # Peers whose leave is committed here (or that had left when we heard of them)
        self.departed = {m for m in roster.known() if roster.left(m)}
        self.redial_gone: dict[str, float] = {}  # departed peer -> dial it until then (cluster/dialling.py)
        # Admin replies held until a snapshot with the change is on disk: (state version, link, frame)
        self.admin_waiting: list[tuple[int, int | None, bytes]] = []
        self.roster_changes = 0  # roster changes made or learnt here: a snapshot holds the roster too

    def _log(self, level: str, event: str, **fields: Any) -> None:
        self._out.append(Log(level, event, fields))

    # ------------------------------------------------------------ the roster changes

    def changed(self) -> list[tuple[str, clustermap.Addr, bool]]:
        """The latest roster changed (proposed here, or a peer's): the members the member must
        add (True: one we did not know) or dial again (False: one that left and joined again)."""
        self.roster_changes += 1
        todo = []
        for m, (_client, peer_addr) in self.roster.known().items():
            if m == self.id:
                continue
            if m not in self.known:
                if self.roster.left(m):  # (it left before we heard of it: it may dial us while it drains)
                    self.departed.add(m)
                todo.append((m, peer_addr, True))
            elif m in self.departed and not self.roster.left(m):
                self.departed.discard(m)
                self.redial_gone.pop(m, None)
                todo.append((m, peer_addr, False))
        return todo

    def announce(self) -> None:
        """Tell every peer our latest roster."""
        self.links.to_peers(encode([PeerType.ROSTER, self.roster.encode()]))
        self.told = {p for p in self.links.out if self.links.up(p) is not None}
        self._log("info", "roster_changed", version=self.roster.version, members=len(self.roster.members()),
                  digest=f"{self.roster.digest():016x}")  # fmt: skip

    def check(self, phase: str, pulling: bool) -> tuple[str, Any] | None:
        """Pull our gains for the latest roster, report it synced, commit it when all are: what
        the member is to do, ("commit", digest) or ("pull", gains), or None."""
        latest = self.roster.digest()
        if latest == self.committed:
            self.synced = latest
            return None
        if not self.roster.members():  # (concurrent leaves of every member: keep the map we have)
            if self.synced != latest:
                self.synced = latest
                self._log("error", "roster_empty", reason="every member has left: the map stays as it is")
            return None
        if phase == "syncing" or not self.partitioned:
            # (no one's map has us yet, or every member holds everything: nothing to wait for)
            return "commit", latest
        if phase != "ready":
            return None
        gone = self.maps.gone
        if self.synced != latest:
            if pulling:  # (a pull runs: no other can start; the map is not cheap)
                return None
            gains = self._gains()
            if gains:
                return "pull", gains
            self.synced = latest
            self._log("info", "roster_synced", digest=f"{latest:016x}", pulled=len(self.pulled))
        if all(v.synced == latest for p, v in self.membership.peers.items()
               if v.state == "ready" and v.reported == "ready" and not gone(p)):  # fmt: skip
            return "commit", latest
        return None

    def _gains(self) -> set[int]:
        """Partitions we own in the target map and hold no state of."""
        cmap = self.maps.cmap
        assert cmap is not None
        s = self.s
        target = clustermap.compute(0, self.roster.members(), self.maps.live_view(), s.partitions, s.replicas)
        now = cmap.owners
        return {p for p, o in enumerate(target.owners) if self.id in o and self.id not in now[p]} - self.pulled

    def commit(self, digest: int, peers: list[str]) -> list[str]:
        """The map moves to the roster ``digest``: returns the peers whose leave is committed now."""
        self.committed = self.synced = digest
        self.pulled = set()
        # (``pending`` stays: a joiner that pulled may not own its gains until it is ready; the
        # map prunes what each pending peer owns, the member's _remap)
        self.maps.placed = placed = self.roster.members()
        self.broker.members = [[m, *a[0]] for m, a in placed.items()]  # (WELCOME's member list)
        if self.roster.version:
            self._log("info", "roster_committed", version=self.roster.version, members=len(placed),
                      digest=f"{digest:016x}")  # fmt: skip
        left = [p for p in peers if self.maps.gone(p)]
        for p in left:
            # (no more pushes: it owns nothing. Our link stays while it drains, so that it
            # hears we committed; once a dial to it fails we stop dialling it: member.py _closed)
            self.departed.add(p)
            self.pending.pop(p, None)
        return left

    def leave_due(self, phase: str, now: float, peer_addr: clustermap.Addr) -> bool:
        """Our leave is committed: True once nothing is left to deliver (or at the deadline), when
        the member stops. ``peer_addr``: our own peer address."""
        if phase != "ready":
            return False
        gone = self.maps.gone
        # (a JOIN of us again, taken where our link was down: stay, if it is at our addresses)
        if self.leave_by < math.inf and not gone(self.id) \
                and self.roster.members().get(self.id, (None, None))[1] == peer_addr:  # fmt: skip
            self.leave_by = math.inf
            self._log("info", "leave_cancelled", reason="joined again")
            return False
        if self.leave_by == math.inf:
            if not gone(self.id):
                return False
            # (committed here, or found committed when we came back: syncing, we restarted after
            # the leave with nothing to deliver, and stop once ready; simulator seed 32)
            self.leave_by = now + self.s.leave_timeout
            self._log("info", "leaving", deadline_s=self.s.leave_timeout)
        # (until every member has moved its map, some may still send us publishes to deliver; and
        # one out of reach may know nothing of our roster: a JOIN and our LEAVE taken where only
        # we and the joiner were, whom it refuses as unknown. We tell it when our link is up)
        # (a config member that committed our roster passes it on to the rest: then one that is
        # down need not hear it from us, or any leave would wait leave_timeout; review)
        peers = self.membership.peers
        relayed = any(v.state == "ready" and v.committed == self.committed and p in self.roster.base_index
                      for p, v in peers.items() if not gone(p))  # fmt: skip
        if any(v.committed != self.committed for p, v in peers.items()
               if (v.state == "ready" or (p not in self.told and not relayed)) and not gone(p)) \
                and now < self.leave_by:  # fmt: skip
            return False
        held = sum(len(c.mailbox) for c in self.broker.clients.values() if c.mailbox is not None)
        if held == 0 or now >= self.leave_by:
            self._log("info", "left", undelivered=held)
            return True
        return False

    # ------------------------------------------------------------ frames

    def roster_frame(self, entries: Any) -> bool:
        """A peer's ROSTER: True if our latest roster changed."""
        try:
            got = decode_untrusted_roster(entries)
        except RosterError as exc:
            raise PeerProtocolError(f"malformed ROSTER: {exc}") from None
        return self.roster.merge(got)

    def heartbeat(self, phase: str) -> bytes:
        """Our HEARTBEAT: our state for the failure detector, the map epoch we are at, and the
        rosters we hold the gains of (synced) and compute the map from (committed)."""
        state = "ready" if phase != "syncing" else "syncing"
        return encode([PeerType.HEARTBEAT, state, self.broker.index.count, self.broker.status()["clients"],
                       self.maps.own.epoch, self.synced, self.committed])  # fmt: skip

    def gains_pulled(self, got: set[int], missed: set[int]) -> bool:
        """A gain PULL ended: a gain counts as pulled once one of its owners answered the whole
        PULL; the rest are pulled again at the next heartbeat. Returns whether all were."""
        self.pulled |= got
        return not missed

    def prune_pending(self, cmap: clustermap.ClusterMap) -> None:
        """The map moved: a pending peer that now owns a partition gets its changes as an owner."""
        for peer, parts in self.pending.items():
            parts.difference_update(p for p in list(parts) if p < cmap.partitions and peer in cmap.owners[p])

    def send_roster(self, lid: int) -> None:
        if self.roster.entries:
            self.links.frame(lid, encode([PeerType.ROSTER, self.roster.encode()]))

    def note_pull(self, peer: str | None, parts: set[int]) -> None:
        """A peer pulled these partitions: push it their later changes too, until it owns them."""
        if self.partitioned and peer is not None and peer != ADMIN and not self.maps.gone(peer):
            self.pending.setdefault(peer, set()).update(parts)

    # ------------------------------------------------------------ admin requests

    def admin(self, f: list[Any], phase: str) -> tuple[str, bool]:
        """An admin JOIN or LEAVE frame, carried out on the roster: (the answer, whether the roster
        changed). RosterError says why not (PeerProtocolError: no admin frame)."""
        kind, n = f[0], len(f)
        if phase != "ready":
            raise RosterError(f"{self.id} is {phase}, not ready: ask another member")
        if kind == PeerType.JOIN and n == 4:
            _, member, client, peer = f
            return self._admin_join(member, _addr(client), _addr(peer))
        if kind == PeerType.LEAVE and n == 2:
            _, member = f
            return self._admin_leave(member)
        raise PeerProtocolError(f"unexpected admin frame type {kind}")

    def _admin_join(self, member: Any, client: clustermap.Addr, peer: clustermap.Addr) -> tuple[str, bool]:
        """Make ``member`` a member (again), or confirm it is one with these addresses (a joiner
        restarted by the same command). RosterError says why not."""
        if member.__class__ is not str or not MEMBER_ID.match(member):
            raise RosterError("JOIN: a member id is 1-64 letters, digits, '_', '.' or '-'")
        current = self.roster.members().get(member)
        if current == (client, peer):
            return f"{member} is a member", False
        if current is not None:
            raise RosterError(f"{member} is already a member with other addresses")
        if member in self.roster.base_index:  # (its process would refuse --join: it is in [[members]])
            raise RosterError(f"{member} is in the config's [[members]] and has left: "
                              "it comes back under a new id")  # fmt: skip
        if member in self.membership.peers and self.membership.peers[member].state in ("ready", "suspect"):
            raise RosterError(f"{member} is still leaving (delivering what it holds): join it once it stopped")
        self.roster.propose_join(member, client, peer)
        return f"{member} is a member", True

    def _admin_leave(self, member: Any) -> tuple[str, bool]:
        if member.__class__ is not str:
            raise RosterError("LEAVE: member id must be a string")
        if self.roster.left(member):  # (a retried request: its leave is in the roster already)
            return f"{member} has left", False
        if self.s.mode == "partitioned" and member in self.s.quorum:  # (the voters are fixed: docs/durable.md)
            raise RosterError(f"{member} is a voter of the durable quorum ([durable] quorum = "
                              f"{list(self.s.quorum)}): it cannot leave")  # fmt: skip
        self.roster.propose_leave(member)
        return f"{member} is leaving", True

    def refused(self, kind: Any, why: str, lid: int | None) -> None:
        self._log("warning", "admin_refused", request=_kind_name(kind), reason=why)
        if lid is not None:
            self.links.frame(lid, encode([PeerType.ADMIN_REPLY, False, why, self.roster.encode()]))

    def accepted(self, kind: Any, message: str, version: int, lid: int | None) -> None:
        """The reply waits for the change on our disk (``version`` persisted): acknowledged, a JOIN
        is never lost with us, and we tell every peer of it again when we come back (simulator
        seed 9202)."""
        self._log("info", "admin", request=_kind_name(kind), result=message)
        if lid is not None:
            self.links.links[lid].deadline = math.inf  # (no idle timeout while the admin waits for the reply)
        self.admin_waiting.append((version, lid, encode([PeerType.ADMIN_REPLY, True, message, self.roster.encode()])))

    def reply_durable(self, persisted: int, now: float) -> None:
        """Send the admin replies whose change is in a snapshot on disk."""
        waiting, self.admin_waiting = self.admin_waiting, []
        links = self.links.links
        for version, lid, frame in waiting:
            if version > persisted:
                self.admin_waiting.append((version, lid, frame))
            elif lid is not None and lid in links:  # (an admin that gave up and went: nothing to tell)
                links[lid].deadline = now + self.s.link_idle_timeout
                self.links.frame(lid, frame)


def _kind_name(kind: Any) -> str:
    try:
        return PeerType(kind).name
    except ValueError:
        return str(kind)[:20]


def _addr(v: Any) -> clustermap.Addr:
    if v.__class__ is not list or len(v) != 2:
        raise RosterError("an address must be [host, port]")
    try:
        return (_ip(v[0], "host"), _port(v[1], "port"))
    except WireError as exc:
        raise RosterError(str(exc)) from None
