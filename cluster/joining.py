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
   any map change, cluster/partitioned.py).
4. A member whose own leave is committed owns nothing; it keeps delivering what its mailboxes
   hold, and stops once they are empty (or ``leave_timeout`` passed) and its queues drained.
   Members send a member whose leave is committed no more pushes; they keep their link to it
   while it drains (and let it dial them), and stop dialling it once a dial fails.

A member that is still syncing (starting up) is in no one's map, so it commits every roster at
once and pulls what it owns in it before it reports ready.

This is a mixin of :class:`cluster.member.MemberCore`, which owns the state.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from roost.client import clustermap
from roost.client.wire import WireError, _ip, _port
from roost.cluster.memberparts import MemberParts
from roost.cluster.peerwire import ADMIN, PeerProtocolError, PeerType, encode
from roost.cluster.roster import MEMBER_ID, Entry, Roster, RosterError, decode_untrusted_roster

if TYPE_CHECKING:
    from roost.cluster.links import Link


class Joining(MemberParts):
    def _init_roster(self, entries: list[tuple[str, Entry]]) -> None:
        self.roster = Roster.of(self.cc.members, entries)
        self.committed = self.roster.digest()  # the roster the map is computed from
        self.synced = self.committed  # the latest roster whose gains we hold
        self.pulled: set[int] = set()  # gains pulled for the roster being committed
        self.pending: dict[str, set[int]] = {}  # peer -> partitions it pulled from us: it gets their changes
        self.leave_by = math.inf  # our leave is committed: stop by then at the latest
        # Peers our latest roster went to, on a link we dialled that was up (a leaver waits for the rest)
        self.told: set[str] = set()
        # Peers whose leave is committed here (or that had left when we heard of them)
        self.departed = {m for m in self.roster.known() if self.roster.left(m)}
        self.redial_gone: dict[str, float] = {}  # departed peer -> dial it until then (cluster/member.py)
        # Admin replies held until a snapshot with the change is on disk: (state version, link, frame)
        self.admin_waiting: list[tuple[int, int | None, bytes]] = []

    @property
    def node_index(self) -> int:
        return self.roster.index_of(self.id)

    def placed(self) -> dict[str, tuple[clustermap.Addr, clustermap.Addr]]:
        """The members the map places partitions on: those of the committed roster."""
        return self.maps.placed

    # ------------------------------------------------------------ peers come and go

    def _add_peer(self, peer: str, addr: clustermap.Addr) -> None:
        """A member we did not know (a join; or one that left before we heard of it): every
        per-peer structure, and a dial at once (none to one that left).
        It counts live only once it reports ``ready`` (it may still be pulling)."""
        self.peers.append(peer)
        self.member_ids.add(peer)
        self.peer_addr[peer] = addr
        self.membership.add(peer, self.now)
        self.replicator.add_peer(peer)
        self.forwarding.add_peer(peer)
        self.out[peer] = None
        self.was_up[peer] = None
        if self.roster.left(peer):  # (it left before we heard of it: it may dial us while it drains)
            self.next_dial[peer] = math.inf
            self.departed.add(peer)
        else:
            self.next_dial[peer] = self.now
            self.unreached.add(peer)

    def _rejoined(self, m: str, peer_addr: clustermap.Addr) -> None:
        """A member that left joined again, maybe at new addresses: dial it (at those), and
        push and repair again."""
        self.departed.discard(m)
        self.redial_gone.pop(m, None)
        if self.peer_addr[m] != peer_addr:
            self.peer_addr[m] = peer_addr
            lid = self.out[m]
            if lid is not None:
                self._close(self.links[lid], "joined again at another address")
        if self.out[m] is None and self.next_dial[m] == math.inf:
            self.next_dial[m] = self.now
            self.unreached.add(m)
        self.replicator.rejoined(m, self.now)  # (its queue was cleared when it left)

    def _roster_changed(self) -> None:
        """The latest roster changed (proposed here, or a peer's): learn new members, tell
        every peer, and work toward committing it."""
        self.roster_changes += 1
        for m, (_client, peer_addr) in self.roster.known().items():
            if m == self.id:
                continue
            if m not in self.member_ids:
                self._add_peer(m, peer_addr)
            elif m in self.departed and not self.roster.left(m):
                self._rejoined(m, peer_addr)
        self.lt.to_peers(encode([PeerType.ROSTER, self.roster.encode()]))
        self.told = {p for p in self.peers if (lid := self.out[p]) is not None and self.links[lid].up}
        self._log("info", "roster_changed", version=self.roster.version, members=len(self.roster.members()),
                  digest=f"{self.roster.digest():016x}")  # fmt: skip
        self._check_roster()

    def _check_roster(self) -> None:
        """Pull our gains for the latest roster, report it synced, commit it when all are."""
        latest = self.roster.digest()
        if latest == self.committed:
            self.synced = latest
            return
        if not self.roster.members():  # (concurrent leaves of every member: keep the map we have)
            if self.synced != latest:
                self.synced = latest
                self._log("error", "roster_empty", reason="every member has left: the map stays as it is")
            return
        if self.phase == "syncing" or not self.partitioned:
            # (no one's map has us yet, or every member holds everything: nothing to wait for)
            self._commit(latest)
            return
        if self.phase != "ready":
            return
        if self.synced != latest:
            if self.life.pull_peer is not None:  # (a pull runs: no other can start; the map is not cheap)
                return
            gains = self._gains()
            if gains:
                if self.life.pull_peer is None:
                    self._start_gain_pull(gains)
                return
            self.synced = latest
            self._log("info", "roster_synced", digest=f"{latest:016x}", pulled=len(self.pulled))
        if all(v.synced == latest for p, v in self.membership.peers.items()
               if v.state == "ready" and v.reported == "ready" and not self._gone(p)):  # fmt: skip
            self._commit(latest)

    def _gains(self) -> set[int]:
        """Partitions we own in the target map and hold no state of."""
        cmap = self.maps.cmap
        assert cmap is not None
        target = clustermap.compute(0, self.roster.members(), self.maps.live_view(), self.s.partitions, self.s.replicas)
        now = cmap.owners
        return {p for p, o in enumerate(target.owners) if self.id in o and self.id not in now[p]} - self.pulled

    def _start_gain_pull(self, gains: set[int]) -> None:
        """PULL the gains from every live peer that owns some of them now (cluster/lifecycle.py)."""
        self.life.pull_gains(gains, self.committed, self.peers)
        self._next_pull()

    def _gain_pull_finished(self) -> bool:
        """A gain counts as pulled once one of its owners answered the whole PULL; the rest are
        pulled again at the next heartbeat (the member's _watch_peers). Returns whether the
        roster is to be checked again now (every gain pulled)."""
        got, missed = self.life.gains_pulled(self.committed)
        self.pulled |= got
        return not missed

    def _commit(self, digest: int) -> None:
        self.committed = self.synced = digest
        self.pulled = set()
        # (``pending`` stays: a joiner that pulled may not own its gains until it is ready; the
        # map prunes what each pending peer owns, cluster/partitioned.py _remap)
        self.maps.placed = placed = self.roster.members()
        self.broker.members = [[m, *a[0]] for m, a in placed.items()]  # (WELCOME's member list)
        if self.roster.version:
            self._log("info", "roster_committed", version=self.roster.version, members=len(placed),
                      digest=f"{digest:016x}")  # fmt: skip
        for p in self.peers:
            if self._gone(p):
                # (no more pushes: it owns nothing. Our link stays while it drains, so that it
                # hears we committed; once a dial to it fails we stop dialling it: member.py _closed)
                self.replicator.left(p)
                self.departed.add(p)
                self.pending.pop(p, None)
        if self.life.pull_peer is not None and self._gone(self.life.pull_peer):
            self._pull_failed("left the cluster", close=False)
        if self.partitioned:
            self._remap()

    def _gone(self, peer: str) -> bool:
        """A member whose leave is committed here."""
        return self.maps.gone(peer)

    def _leave_due(self) -> None:
        """Our leave is committed: stop once nothing is left to deliver (or at the deadline)."""
        if self.phase != "ready":
            return
        # (a JOIN of us again, taken where our link was down: stay, if it is at our addresses)
        if self.leave_by < math.inf and not self._gone(self.id) \
                and self.roster.members().get(self.id, (None, None))[1] == self.peer_addr[self.id]:  # fmt: skip
            self.leave_by = math.inf
            self._log("info", "leave_cancelled", reason="joined again")
            return
        if self.leave_by == math.inf:
            if not self._gone(self.id):
                return
            # (committed here, or found committed when we came back: syncing, we restarted after
            # the leave with nothing to deliver, and stop once ready; simulator seed 32)
            self.leave_by = self.now + self.s.leave_timeout
            self._log("info", "leaving", deadline_s=self.s.leave_timeout)
        # (until every member has moved its map, some may still send us publishes to deliver; and
        # one out of reach may know nothing of our roster: a JOIN and our LEAVE taken where only
        # we and the joiner were, whom it refuses as unknown. We tell it when our link is up)
        # (a config member that committed our roster passes it on to the rest: then one that is
        # down need not hear it from us, or any leave would wait leave_timeout; review)
        peers = self.membership.peers
        relayed = any(v.state == "ready" and v.committed == self.committed and p in self.roster.base_index
                      for p, v in peers.items() if not self._gone(p))  # fmt: skip
        if any(v.committed != self.committed for p, v in peers.items()
               if (v.state == "ready" or (p not in self.told and not relayed)) and not self._gone(p)) \
                and self.now < self.leave_by:  # fmt: skip
            return
        held = sum(len(c.mailbox) for c in self.broker.clients.values() if c.mailbox is not None)
        if held == 0 or self.now >= self.leave_by:
            self._log("info", "left", undelivered=held)
            self._stop()

    # ------------------------------------------------------------ frames

    def _on_roster_frame(self, entries: Any) -> None:
        try:
            got = decode_untrusted_roster(entries)
        except RosterError as exc:
            raise PeerProtocolError(f"malformed ROSTER: {exc}") from None
        if self.roster.merge(got):
            self._roster_changed()

    def _send_roster(self, link: Link) -> None:
        if self.roster.entries:
            self.lt.frame(link.id, encode([PeerType.ROSTER, self.roster.encode()]))

    def _admin_join(self, member: Any, client: clustermap.Addr, peer: clustermap.Addr) -> str:
        """Make ``member`` a member (again), or confirm it is one with these addresses (a joiner
        restarted by the same command). RosterError says why not."""
        if member.__class__ is not str or not MEMBER_ID.match(member):
            raise RosterError("JOIN: a member id is 1-64 letters, digits, '_', '.' or '-'")
        current = self.roster.members().get(member)
        if current != (client, peer):
            if current is not None:
                raise RosterError(f"{member} is already a member with other addresses")
            if member in self.roster.base_index:  # (its process would refuse --join: it is in [[members]])
                raise RosterError(f"{member} is in the config's [[members]] and has left: "
                                  "it comes back under a new id")  # fmt: skip
            if member in self.membership.peers and self.membership.peers[member].state in ("ready", "suspect"):
                raise RosterError(f"{member} is still leaving (delivering what it holds): join it once it stopped")
            self.roster.propose_join(member, client, peer)
            self._roster_changed()
        return f"{member} is a member"

    def _admin_leave(self, member: Any) -> str:
        if member.__class__ is not str:
            raise RosterError("LEAVE: member id must be a string")
        if self.roster.left(member):  # (a retried request: its leave is in the roster already)
            return f"{member} has left"
        self.roster.propose_leave(member)
        self._roster_changed()
        return f"{member} is leaving"

    def _on_admin(self, link: Link, f: list[Any]) -> None:
        """A request from ``roost cluster join/leave`` (authenticated like a peer)."""
        self.admin_request(f, link.id)

    def admin_request(self, f: list[Any], lid: int | None) -> tuple[bool, str, int]:
        """Carry out an admin JOIN or LEAVE frame; the reply goes on link ``lid`` (None: the
        simulator's admin, which watches ``persisted``). Returns (done, message, the state
        version that must be on disk before the reply goes out)."""
        kind, n = f[0], len(f)
        try:
            if not self.ready:
                raise RosterError(f"{self.id} is {self.phase}, not ready: ask another member")
            if kind == PeerType.JOIN and n == 4:
                _, member, client, peer = f
                message = self._admin_join(member, _addr(client), _addr(peer))
            elif kind == PeerType.LEAVE and n == 2:
                _, member = f
                message = self._admin_leave(member)
            else:
                raise PeerProtocolError(f"unexpected admin frame type {kind}")
        except RosterError as exc:
            self._log("warning", "admin_refused", request=_kind_name(kind), reason=str(exc))
            if lid is not None:
                self.lt.frame(lid, encode([PeerType.ADMIN_REPLY, False, str(exc), self.roster.encode()]))
            return False, str(exc), 0
        self._log("info", "admin", request=_kind_name(kind), result=message)
        # (the reply waits for the change on our disk: acknowledged, a JOIN is never lost with us,
        # and we tell every peer of it again when we come back; simulator seed 9202)
        version = self.state_version
        if lid is not None:
            self.links[lid].deadline = math.inf  # (no idle timeout while the admin waits for the reply)
        self.admin_waiting.append((version, lid, encode([PeerType.ADMIN_REPLY, True, message, self.roster.encode()])))
        self._reply_durable()
        return True, message, version

    def _reply_durable(self) -> None:
        """Send the admin replies whose change is in a snapshot on disk."""
        waiting, self.admin_waiting = self.admin_waiting, []
        for version, lid, frame in waiting:
            if version > self.life.persisted:
                self.admin_waiting.append((version, lid, frame))
            elif lid is not None and lid in self.links:  # (an admin that gave up and went: nothing to tell)
                self.links[lid].deadline = self.now + self.s.link_idle_timeout
                self.lt.frame(lid, frame)

    def _note_pull(self, peer: str | None, parts: set[int]) -> None:
        """A peer pulled these partitions: push it their later changes too, until it owns them."""
        if self.partitioned and peer is not None and peer != ADMIN and not self._gone(peer):
            self.pending.setdefault(peer, set()).update(parts)


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
