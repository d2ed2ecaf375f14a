"""One member of a replicated cluster, sans-IO: events and time in, actions out.

Theory of operation
-------------------
A member is a broker core (node/core.py) plus everything that keeps its replica of the
subscription state equal to the other members' (docs/cluster.md); each part's own theory opens
its module:

* Start-up (FASTPUSS: "pick one of the other nodes randomly and ask for a massive data
  transfer in pull fashion"): our snapshot and a PULL from one peer after another, then
  ``ServeClients``; snapshots every ``snapshot_interval``; ``Stop`` drains the pushes we owe,
  writes a last snapshot and ``Exit``s (cluster/lifecycle.py).
* Changes: every local SUB/UNSUB comes out of the broker core as a ``Replicate`` action and is
  PUSHed to each peer that keeps it, a window of frames in flight; anti-entropy every
  ``anti_entropy_interval`` repairs what a link or a queue lost (cluster/replicator.py;
  answers stream as their link drains, cluster/dumps.py).
* Links: each member dials every peer (cluster/dialling.py); a dialled link carries our
  requests and heartbeats and is closed and dialled again when silent for ``down_after``
  (cluster/links.py, cluster/peerframes.py).
* Failure detection: HEARTBEATs every ``heartbeat_interval`` (their own timer);
  cluster/membership.py turns silence into suspect and down, and the member closes the link of
  a peer gone down (it may be a dead TCP connection); clients of a peer down for longer than
  ``subscriber_timeout`` expire (cluster/liveness.py).

Phases of the member::

    starting --Start--> syncing --pull done and snapshot read--> ready
    syncing|ready --Stop--> stopping --last snapshot done, pushes drained--> stopped

Each link has its own phase (cluster/links.py). Randomness (PULL order, handshake nonces) comes
from the ``rng`` argument and time from ``now``: the simulator (sim/simulation.py) runs a whole
cluster of these, seeded.

Composition
-----------
MemberCore is a router: it owns the phase, the timers and the links' events, and hands each
event to the component that owns the state it concerns, gathering their actions on one shared
list (``_out``, returned by ``handle``). Each component is a plain class with its own state; it
gets the shared small objects it needs (the action list, the link table, the roster, the map,
the broker core, other components, settings) when it is made and never calls the member: what
the member must do next comes back as a return value.

* ``lt`` (cluster/links.py LinkTable): every link, our dialled link per peer; frames out.
* ``dialling`` (cluster/dialling.py Dialling): when each peer is dialled, at which address.
* ``frames`` (cluster/peerframes.py PeerFrames): each peer frame to its component; what next.
* ``actions`` (cluster/brokeractions.py BrokerActions): the broker core's actions routed.
* ``maps`` (cluster/partitionmap.py PartitionMap): our live view, the map, its epochs.
* ``joins`` (cluster/joining.py Joining): the roster committed and synced, leaves, admin requests.
* ``replicator`` (cluster/replicator.py Replicator): push queues, who gets a change, hand-off,
  anti-entropy rounds, held CMDACKs.
* ``forwarding`` (cluster/forwarding.py Forwarding): FORWARD/FWDACK queues and RELAY.
* ``life`` (cluster/lifecycle.py Lifecycle): the PULL in progress and the snapshots.
* ``liveness`` (cluster/liveness.py Liveness): verdicts acted on, pauses, clients of the dead.
* ``durable`` (cluster/durable.py DurableLogs): the partition logs (Trace actions with cfg.trace).
* ``dumps`` (cluster/dumps.py Dumps): the DUMP/DIFF answers in progress.
* ``statusview`` (cluster/memberstatus.py MemberStatus): what ``roost status`` shows.
* ``membership`` (cluster/membership.py Membership): the failure detector.
"""

from __future__ import annotations

import math
import random
from typing import Any

from roost.client.clustermap import ClusterMap
from roost.cluster import peerframes
from roost.cluster.brokeractions import BrokerActions
from roost.cluster.config import ClusterConfig
from roost.cluster.dialling import Dialling
from roost.cluster.dumps import Dumps
from roost.cluster.durable import DurableLogs
from roost.cluster.events import (
    Accepted,
    Action,
    Close,
    Datagrams,
    EpochsPersisted,
    Event,
    Exit,
    LinkBytes,
    LinkClosed,
    LinkOpened,
    LinkSent,
    Log,
    LogFailed,
    LogRecords,
    LogReloaded,
    LogRetained,
    LogsRead,
    LogWritten,
    PersistDone,
    RaftPersisted,
    ReadSnapshot,
    ServeClients,
    SnapshotRead,
    Start,
    Stop,
)  # fmt: skip
from roost.cluster.forwarding import Forwarding
from roost.cluster.joining import Joining
from roost.cluster.lifecycle import Lifecycle
from roost.cluster.links import Link, LinkTable
from roost.cluster.liveness import Liveness
from roost.cluster.membership import Membership
from roost.cluster.memberstatus import MemberStatus
from roost.cluster.partitionmap import PartitionMap
from roost.cluster.peerframes import PeerFrames
from roost.cluster.replicator import Replicator
from roost.cluster.roster import Entry, Roster, RosterError
from roost.node.core import BrokerCore


class MemberCore:
    def __init__(
        self,
        cc: ClusterConfig,
        member_id: str,
        *,
        rng: random.Random,
        now: float,
        wall_offset: float,
        incarnation: int,
        bind_host: str | None = None,
        peer_hosts: dict[str, str] | None = None,
        roster: list[tuple[str, Entry]] | None = None,
    ) -> None:
        self.cc = cc
        self.s = s = cc.settings
        self.id = member_id
        self.me = cc.member(member_id)
        self.cfg = cc.node_config(member_id, bind_host)
        self.secret = s.secret.encode()
        self.rng = rng
        self.wall_offset = wall_offset
        self.roster = Roster.of(cc.members, roster or [])  # (the base config plus joins and leaves)
        members = self.roster.members()
        known = self.roster.known()  # (members that left too: one still draining may dial us)
        self.peers = [m for m in known if m != member_id]
        hosts = peer_hosts or {}
        self.peer_addr = {m: (hosts.get(m, a[1][0]), a[1][1]) for m, a in known.items()}
        self.member_ids = set(known)
        self.shape = f"partitioned/{s.partitions}/{s.replicas}" if s.mode == "partitioned" else s.mode
        # The broker draws its cookie keys from our rng itself (the shell's SystemRandom), not
        # from a generator seeded by it: the keys are this member's alone, never the secret.
        self.broker = BrokerCore(
            self.cfg, rng, incarnation,
            members=[[m, *a[0]] for m, a in members.items()], node_idx=self.roster.index_of(member_id),
            wall_offset=wall_offset, replicating=True, tombstone_horizon=s.tombstone_horizon,
        )  # fmt: skip
        self.membership = Membership(self.peers, s.suspect_after, s.down_after, now)
        self.phase = "starting"
        self.now = now
        self._out: list[Action] = []  # (shared with the components: handed out after every event)
        self.lt = LinkTable(self.peers, self._out)
        self.links = self.lt.links  # (the same dict: every link by id)
        self.out = self.lt.out  # (the same dict: our dialled link per peer)
        self.next_heartbeat = now
        self.next_membership = now + s.heartbeat_interval
        self.next_gc = now + s.tombstone_horizon / 10
        self.maps = PartitionMap(member_id, s, self.broker, self.membership, self.roster, self._out)
        self.joins = Joining(member_id, s, self.roster, self.member_ids, self.maps, self.membership, self.broker,
                             self.lt, self._out)  # fmt: skip
        self.pending = self.joins.pending  # (the same dict: peers pulling partitions from us)
        self.own = self.maps.own  # (the same object: which partitions we own)
        self.unreached = self.maps.unreached  # (the same set)
        left = {p for p in self.peers if self.roster.left(p)}
        self.dialling = Dialling(s, self.peers, self.member_ids, self.peer_addr, left, self.unreached,
                                 self.joins.redial_gone, self.lt, self._out, now)  # fmt: skip
        self.replicator = Replicator(member_id, s, self.peers, self.broker, self.lt, self.maps, self.membership,
                                     self.pending, self._out, no_handoff="no-handoff" in self.cfg.breaks)  # fmt: skip
        self.queues = self.replicator.queues  # (the same dict: what we owe each peer)
        self.forwarding = Forwarding(self.peers, s.max_forward_queue, s.max_frame // 2, self.broker, self.lt, self._out)
        self.life = Lifecycle(member_id, s, wall_offset, now, self.broker, self.roster, self.lt, self.maps, self._out)
        self.durable = DurableLogs(member_id, s, self.cfg, wall_offset, now, self.broker, self.lt, self.maps, rng,
                                   self._out)  # fmt: skip
        self.plogs = self.durable.plogs  # (the same dict: the active partition logs)
        self.liveness = Liveness(member_id, self.cfg, s.heartbeat_interval, s.mode == "partitioned", self.broker,
                                 self.membership, self.peers, self.lt, self.pending, self.life, self.replicator,
                                 self.durable, self._out)  # fmt: skip
        self.partitioned = s.mode == "partitioned"
        self.statusview = MemberStatus(cc, member_id, self.peers, self.broker, self.membership, self.lt, self.queues,
                                       self.roster, self.maps, self.joins, self.replicator.last_synced)  # fmt: skip
        self.actions = BrokerActions(self.broker, self.replicator, self.forwarding, self.durable, self.statusview,
                                     self._out)  # fmt: skip
        self.dumps = Dumps(s, self.broker, self.maps, self.joins, self.lt, self._out)
        self.frames = PeerFrames(member_id, self.secret, self.member_ids, self.shape, rng, s, self.broker, self.actions,
                                 self.lt, self.membership, self.maps, self.joins, self.replicator, self.forwarding,
                                 self.life, self.liveness, self.durable, self.dumps, self.dialling,
                                 self._out)  # fmt: skip
        if self.partitioned:
            self.broker.set_ownership(self.own)
            self._remap()

    # ------------------------------------------------------------ entry points

    def handle(self, ev: Event, now: float) -> list[Action]:
        stood = now - self.now - self.s.heartbeat_interval  # (we are called at least this often)
        self.now = now
        if stood > self.s.local_pause and self.phase != "stopped":  # (our loop stood still: cluster/liveness.py)
            self.liveness.paused(stood, now, self.phase in ("syncing", "ready"))  # (starting: credited quietly)
        if isinstance(ev, Datagrams):
            if self.phase in ("syncing", "ready"):  # (stopping: no answer, the client fails over)
                self.actions.absorb(self.broker.handle_datagrams(ev.batch, now), now, self.phase)
        elif isinstance(ev, LinkBytes):
            self._on_bytes(ev.link, ev.data)
        elif isinstance(ev, LinkOpened):
            self.lt.opened(ev.link, self.id, self.rng, self.shape)
        elif isinstance(ev, Accepted):
            self.lt.accepted(ev.link, now + self.s.handshake_timeout, ev.remote, self.phase in ("stopping", "stopped"))
        elif isinstance(ev, LinkSent):
            self.lt.sent(ev.link, ev.nbytes)
        elif isinstance(ev, LinkClosed):
            link = self.links.get(ev.link)
            if link is not None:
                self._closed(link, ev.reason)
        elif isinstance(ev, SnapshotRead):
            self._on_snapshot(ev.data, ev.reason)
        elif isinstance(ev, PersistDone):
            self._on_persisted(ev.token, ev.error)
        elif isinstance(ev, EpochsPersisted):  # (the map epochs' ceiling: cluster/partitionmap.py)
            fatal = self.maps.persisted(ev.ceiling, ev.error)
            if fatal is not None:
                self._fatal(fatal)
            self._maybe_ready()
        elif isinstance(ev, LogWritten | LogRecords | LogRetained | LogsRead | LogFailed | LogReloaded | RaftPersisted):
            if isinstance(ev, LogsRead) and ev.epochs is not None and not ev.error and self.partitioned:
                self.maps.restored(ev.epochs)  # (epochs above our earlier lives': cluster/partitionmap.py)
            fatal = self.durable.on_log_event(ev, now, self.ready)  # (cluster/durable.py)
            if fatal is not None:
                self._fatal(fatal)
        elif isinstance(ev, Start):
            self._start()
        elif isinstance(ev, Stop):
            self._stop()
        # (Tick: only the timers below)
        self._due(now)
        out = self._out[:]
        self._out.clear()
        return out

    def next_deadline(self) -> float:
        if self.phase in ("starting", "stopped"):
            return math.inf
        life = self.life
        d = min(self.next_heartbeat, self.next_membership, self.next_gc, life.next_snapshot, life.pull_deadline)
        # (only deadlines _due acts on in this phase: any other would wake us for nothing, forever)
        if self.phase in ("syncing", "ready"):
            d = min(d, self.dialling.deadline())
        d = min(d, self.replicator.deadline(self.ready))
        for link in self.links.values():
            d = min(d, link.deadline)
        if self.dumps.due():
            d = min(d, self.now)
        d = min(d, self.durable.deadline())
        b = self.broker.next_deadline()
        return d if b is None else min(d, b)

    @property
    def ready(self) -> bool:
        return self.phase == "ready"

    @property
    def state_version(self) -> int:
        """Grows with every change a snapshot holds: registers and the roster."""
        return self.broker.changes + self.joins.roster_changes

    @property
    def leave_by(self) -> float:
        """Our leave is committed: we stop by then at the latest (cluster/joining.py)."""
        return self.joins.leave_by

    @property
    def persisted(self) -> int:
        """``state_version`` as of the last snapshot on disk (cluster/lifecycle.py)."""
        return self.life.persisted

    def status(self) -> dict[str, Any]:
        """The cluster as this member sees it (``roost status``; cluster/memberstatus.py)."""
        return self.statusview.status(self.phase, self.now)

    @property
    def cmap(self) -> ClusterMap | None:
        """Our cluster map (partitioned mode; cluster/partitionmap.py)."""
        return self.maps.cmap

    # ------------------------------------------------------------ plumbing

    def _log(self, level: str, event: str, **fields: Any) -> None:
        self._out.append(Log(level, event, fields))

    def _absorb(self, actions: list[Any]) -> None:
        """Pass the broker core's actions on (cluster/brokeractions.py)."""
        self.actions.absorb(actions, self.now, self.phase)

    # ------------------------------------------------------------ timers

    def _due(self, now: float) -> None:
        s = self.s
        if self.phase in ("starting", "stopped"):
            return
        if self.phase != "stopping":
            self.dialling.due(now)
        for link in [x for x in self.links.values() if x.deadline <= now]:
            self._close(link, ("silent" if link.outbound else "idle timeout") if link.up else "handshake timeout")
        if now >= self.next_heartbeat:
            self.next_heartbeat = now + s.heartbeat_interval
            self.lt.to_peers(self.joins.heartbeat(self.phase))
            if self.partitioned:
                for msgs in self.forwarding.refused():
                    self.actions.reroute(msgs, now, self.phase)
        if now >= self.next_membership:
            self.next_membership = now + s.heartbeat_interval
            self._watch_peers(now)
        if now >= self.life.pull_deadline:
            self._pull_failed("timeout", close=True)
        if self.ready:
            self.replicator.digests_due(now)
        if now >= self.next_gc:
            self.next_gc = now + s.tombstone_horizon / 10
            self._absorb(self.broker.collect_tombstones(now))
        self.life.snapshot_due(now, self.ready, self.state_version, bool(self.joins.admin_waiting))
        b = self.broker.next_deadline()
        if b is not None and b <= now:
            self._absorb(self.broker.tick(now))
        self.dumps.turn()
        self.replicator.release_held(now)
        self.durable.due(now, self.ready)
        if self.joins.leave_due(self.phase, now, self.peer_addr[self.id]):
            self._stop()
        if self.phase == "stopping":
            self._drain()

    # ------------------------------------------------------------ start, pull, snapshots, stop (cluster/lifecycle.py)

    def _start(self) -> None:
        if self.phase != "starting":
            return
        self.phase = "syncing"
        if self.partitioned:
            self.maps.started()  # (our map handed out now if no store was read: cluster/partitionmap.py)
        self._log("info", "node_starting", state="syncing", peer_addr="{}:{}".format(*self.peer_addr[self.id]),
                  members=len(self.roster.members()))  # fmt: skip
        self._out.append(ReadSnapshot())
        self.life.pull_order = order = list(self.peers)  # (the order of our PULLs, drawn from our rng)
        self.rng.shuffle(order)
        self._next_pull()

    def _next_pull(self) -> None:
        if self.life.next_pull(self.now):
            self._pull_finished()

    def _pull_failed(self, why: str, close: bool) -> None:
        peer = self.life.pull_failed(why)
        if peer is None:
            return
        lid = self.out[peer]
        if close and lid is not None:
            self._close(self.links[lid], "pull " + why)  # late DUMP frames must not arrive
        self._next_pull()

    def _pull_finished(self) -> None:
        if not self.life.pull_finished():
            self._maybe_ready()
        elif self.joins.gains_pulled(*self.life.gains_pulled(self.joins.committed)):
            self._check_roster()  # (every gain pulled; any other is pulled again at the next heartbeat)

    def _on_snapshot(self, data: bytes | None, reason: str) -> None:
        if self.life.snapshot_done:
            return
        got = self.life.snapshot_read(data, reason)
        if got is not None:
            written, chunks, roster = got
            for entries in chunks:
                self._absorb(self.broker.merge(entries, self.now))
            if self.roster.merge(roster):
                self._roster_changed()
            age = self.now + self.wall_offset - written
            self._log("info", "loaded_snapshot", subscriptions=self.broker.index.count, age_s=round(age, 1))
        self._maybe_ready()

    def _maybe_ready(self) -> None:
        life = self.life
        if self.phase != "syncing" or not (life.pull_done and life.snapshot_done):
            return
        if self.partitioned and not self.maps.servable():  # (a map above our earlier lives' first)
            return
        if life.pulled_from is None and self.broker.index.count == 0:
            self._log("info", "started_empty", reason="no peer answered a PULL and no snapshot")
        self.phase = "ready"
        if self.partitioned:
            # What we hold of partitions we do not own (our clients' registers, from the
            # snapshot) may never have reached the owners before we went down: hand it off.
            # Only our clients': another client's register there is a copy we kept as an old
            # owner, which may have been stale for longer than the horizon by now, its
            # tombstone collected by the owners, and would come back (simulator seed 73).
            theirs = {p for p, mine in enumerate(self.own.owned) if not mine}
            self.replicator.hand_off(self.maps.new_owners(theirs, None), ours=True)
        self._out.append(ServeClients())
        self._log("info", "node_ready", subscriptions=self.broker.index.count, pulled_from=life.pulled_from)
        self.replicator.ready(self.now)

    def _on_persisted(self, token: int, error: str | None) -> None:
        ok = self.life.written(token, error)
        if ok is None:
            return
        if ok:
            self._reply_durable()
        if self.phase == "stopping":
            self.life.last_write(not ok, self.state_version, self.now)

    def _stop(self) -> None:
        if self.phase in ("stopping", "stopped"):
            return
        was_ready = self.ready
        self.phase = "stopping"
        for link in [x for x in self.links.values() if not x.outbound or not x.up]:
            self._close(link, "stopping")
        self.life.stopping(was_ready, self.state_version, self.now)

    def _fatal(self, why: str) -> None:
        """This member must not run: at start (it never served: nothing to write or hand over), or
        a durable log failed on disk (cluster/durable.py: it stops as a crash would)."""
        self._log("error", "cannot_run", reason=why)
        self.phase = "stopped"  # (first: closing a link while syncing could make us ready and serve)
        for link in list(self.links.values()):
            self._close(link, "cannot run")
        self._out.append(Exit(why))

    def _drain(self) -> None:
        """Stopping: close each dialled link whose pushes are all acknowledged;
        exit once none is left and the last snapshot is done."""
        for peer, lid in self.out.items():
            if lid is not None and self.replicator.drained(peer) and not self.forwarding.queues[peer]:
                self._close(self.links[lid], "stopping")
        if self.life.final_done and not self.links:
            self.phase = "stopped"
            self._log("info", "node_stopped", subscriptions=self.broker.index.count)
            self._out.append(Exit())

    # ------------------------------------------------------------ joins and leaves (cluster/joining.py)

    def _add_peer(self, peer: str, addr: tuple[str, int]) -> None:
        """A member we did not know (a join; or one that left before we heard of it): every
        per-peer structure, and a dial at once (none to one that left).
        It counts live only once it reports ``ready`` (it may still be pulling)."""
        self.dialling.add_peer(peer, addr, self.roster.left(peer), self.now)  # (our peers, links, dials, view)
        self.membership.add(peer, self.now)
        self.replicator.add_peer(peer)
        self.forwarding.add_peer(peer)

    def _rejoined(self, m: str, peer_addr: tuple[str, int]) -> None:
        """A member that left joined again, maybe at new addresses: dial it (at those), and
        push and repair again."""
        if self.dialling.moved(m, peer_addr):
            lid = self.out[m]
            if lid is not None:
                self._close(self.links[lid], "joined again at another address")
        self.dialling.rejoined(m, self.now)
        self.replicator.rejoined(m, self.now)  # (its queue was cleared when it left)

    def _roster_changed(self) -> None:
        """The latest roster changed (proposed here, or a peer's): learn new members, tell
        every peer, and work toward committing it."""
        for m, peer_addr, new in self.joins.changed():
            if new:
                self._add_peer(m, peer_addr)
            else:
                self._rejoined(m, peer_addr)
        self.joins.announce()
        self._check_roster()

    def _check_roster(self) -> None:
        """Pull our gains for the latest roster, report it synced, commit it when all are."""
        todo = self.joins.check(self.phase, self.life.pull_peer is not None)
        if todo is None:
            return
        if todo[0] == "pull":  # (from every live peer that owns some of them now: cluster/lifecycle.py)
            self.life.pull_gains(todo[1], self.joins.committed, self.peers)
            self._next_pull()
        else:
            self._commit(todo[1])

    def _commit(self, digest: int) -> None:
        """The map moves to the roster ``digest``."""
        for p in self.joins.commit(digest, self.peers):
            self.replicator.left(p)
        pulling = self.life.pull_peer
        if pulling is not None and self.maps.gone(pulling):
            self._pull_failed("left the cluster", close=False)
        if self.partitioned:
            self._remap()

    def admin_request(self, f: list[Any], lid: int | None) -> tuple[bool, str, int]:
        """Carry out an admin JOIN or LEAVE frame; the reply goes on link ``lid`` (None: the
        simulator's admin, which watches ``persisted``). Returns (done, message, the state
        version that must be on disk before the reply goes out)."""
        try:
            message, changed = self.joins.admin(f, self.phase)
            if changed:
                self._roster_changed()
        except RosterError as exc:
            self.joins.refused(f[0], str(exc), lid)
            return False, str(exc), 0
        version = self.state_version
        self.joins.accepted(f[0], message, version, lid)
        self._reply_durable()
        return True, message, version

    def _reply_durable(self) -> None:
        """Send the admin replies whose change is in a snapshot on disk."""
        self.joins.reply_durable(self.life.persisted, self.now)

    # ------------------------------------------------------------ the map

    def _remap(self) -> None:
        """Compute the map of our current view (cluster/partitionmap.py); if its owners changed,
        hand off (as the partitions' old owner, or as the home of clients with registers there,
        so no change stays behind on a member that no longer owns it), route our forwards again,
        tell the durable logs their owners, and run anti-entropy at once with the co-owners of
        what we gained (a new secondary is filled from the primary within one round)."""
        moved = self.maps.remap(self.now)
        cmap = self.maps.cmap
        assert cmap is not None
        self.joins.prune_pending(cmap)
        if moved is None:
            return
        old, gained = moved
        if gained:  # (clients of a member down long enough expire in the partitions we now own too)
            self.liveness.gained()
        if old is None:
            return
        self.replicator.hand_off(self.maps.new_owners(self.maps.moved(old), old))
        for msgs in self.forwarding.to_route_again(cmap.live):
            self.actions.reroute(msgs, self.now, self.phase)
        self.durable.map_changed(old, self.now, self.ready)
        if gained and self.ready:
            self.replicator.gained(gained, cmap, self.now)

    # ------------------------------------------------------------ liveness

    def _watch_peers(self, now: float) -> None:
        """The failure detector's verdicts (cluster/membership.py), acted on; then the clients of
        members down for good expire (cluster/liveness.py)."""
        changed, down = self.liveness.watch(now)
        for lid in down:
            self._close(self.links[lid], "peer down")  # it may be a dead TCP connection
        if changed and self.partitioned:
            self._remap()
        if self.joins.committed != self.roster.digest():  # (and gains whose pull failed are pulled again)
            self._check_roster()
        # (leaving, we may not hear the members that stopped dialling us)
        if self.ready and not self.maps.gone(self.id):
            for actions in self.liveness.expire_lost_homes(now):
                self._absorb(actions)

    # ------------------------------------------------------------ links

    def _close(self, link: Link, why: str) -> None:
        """We end a link: tell the runner, then forget it."""
        self._out.append(Close(link.id, why))
        self._closed(link, why)

    def _closed(self, link: Link, why: str) -> None:
        """A link closed; if it was our dialled link to its peer (cluster/peerframes.py), a PULL
        on it fails, and a peer never reached leaves our view."""
        peer = link.peer
        if self.frames.closed(link, why, self.now) and peer is not None:
            if self.life.pull_peer == peer:
                self._pull_failed(why, close=False)
            if not link.up and self.maps.dial_failed(peer):
                self._remap()

    def _on_bytes(self, lid: int, data: bytes) -> None:
        """Frames on a link: the handshake's (cluster/links.py), then the peer's requests and
        replies (cluster/peerframes.py), each followed by what it asks of the member."""
        link = self.links.get(lid)
        if link is None:
            return
        frames = self.frames
        try:
            link.decoder.feed(data)
            while lid in self.links and (f := link.decoder.next_frame_untrusted()) is not None:
                if link.up:
                    if link.outbound:
                        then = frames.reply(link, f, self.now, self.phase)
                    else:
                        then = frames.request(link, f, self.now, self.phase)
                    if then:
                        self._then(then, link, f)
                else:
                    frames.handshake(link, f, self.now, self.phase)
        except Exception as exc:  # nothing a peer sends may stop this member
            why = frames.refused(link, exc)
            if why is not None:
                self._close(link, why)

    def _then(self, then: tuple[str, ...], link: Link, f: list[Any]) -> None:
        """What a peer's frame asks of the member next (cluster/peerframes.py), in order."""
        for step in then:
            if step == peerframes.ADMIN_REQUEST:
                self.admin_request(f, link.id)  # (roost cluster join/leave, authenticated like a peer)
            elif step == peerframes.REMAP:
                self._remap()
            elif step == peerframes.CHECK_ROSTER:
                self._check_roster()
            elif step == peerframes.ROSTER_CHANGED:
                self._roster_changed()
            elif step == peerframes.PULL_FAILED:
                self._pull_failed("peer is not ready itself", close=False)
            elif step == peerframes.NEXT_PULL:
                self._next_pull()
            else:
                assert step == peerframes.PULL_FINISHED
                self._pull_finished()
