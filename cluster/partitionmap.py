"""A member's cluster map in partitioned mode: its view of who is live, and who owns which partition (sans-IO).

Theory of operation (docs/cluster.md, "Partitioned mode")
---------------------------------------------------------
Each member computes the cluster map (client/clustermap.py) from its own view:
the members of the committed roster (``placed``), live unless its failure
detector holds them ``down`` or they report ``syncing``; a member always counts
itself live (while it syncs it must accept the state of the partitions it is
about to own). A peer not heard from since we started counts live until a dial
to it fails (``unreached``).

When the owners change, :meth:`PartitionMap.remap` installs the map with a new
epoch (past every epoch heard in heartbeats), tells the broker core (its map
for clients, and the re-index of node/ownership.py) and returns the map before
and the partitions gained: what follows a change (hand-off, forwards routed
again, the durable logs' owners, anti-entropy) is the member's to do with its
other components. A change of the live set alone keeps the epoch.

Epochs are monotonic forever (docs/cluster.md, "Map epochs across restarts"): a member never
hands out (to the broker core, so to WELCOME, MAP and REDIRECT) a map whose epoch is not above
every epoch it handed out in an earlier life. It reserves epochs in blocks: the shell reads the
ceiling its earlier lives stored (``LogsRead.epochs``, cluster/epochstore.py) and the member's
epochs start above it (``restored``); a map whose epoch is above the ceiling durable now is
computed and installed for routing at once, but handed out only once a new ceiling, its epoch
plus ``EPOCH_BLOCK`` - 1, is on disk (``PersistEpochs``, answered ``EpochsPersisted``:
``persisted``); until then the broker keeps the map it had. One write is in flight at a time.
Before serving clients at all (``servable``) a member raises its map's epoch past every epoch it
heard from a peer while it synced, so one restarted from an old disk does not come back with a
map older than its peers'. Without a store (a core no shell gave one: ``LogsRead.epochs`` None)
epochs live in memory, as they did before.

This is one component of :class:`cluster.member.MemberCore`; the broker core,
the failure detector's view and the action list are shared with the member.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from roost.client import clustermap
from roost.cluster.config import ClusterSettings
from roost.cluster.events import PersistEpochs
from roost.cluster.membership import Membership
from roost.cluster.roster import Roster
from roost.node.actions import Log, Trace
from roost.node.core import BrokerCore
from roost.node.ownership import Ownership

#: Epochs reserved by one write of the ceiling: a member writes it about once per this many maps.
EPOCH_BLOCK = 1000
#: The highest epoch (and ceiling) there is: a HEARTBEAT carries epochs below 2**62
#: (cluster/peerframes.py). At a thousand maps a second it lasts over a hundred million years.
MAX_EPOCH = (1 << 62) - 1


class PartitionMap:
    def __init__(self, member_id: str, s: ClusterSettings, broker: BrokerCore, membership: Membership,
                 roster: Roster, actions: list[Any]) -> None:  # fmt: skip
        self.id = member_id
        self.s = s
        self.partitioned = s.mode == "partitioned"
        self.broker = broker
        self.membership = membership
        self.actions = actions
        self.own = Ownership(member_id, s.partitions)
        self.cmap: clustermap.ClusterMap | None = None
        self.epoch_seen = 0
        self.roster = roster
        self.placed = roster.members()  # the members of the committed roster (cluster/joining.py commits)
        # Peers never heard from since we started whose dial failed: not live (review finding #4)
        self.unreached: set[str] = set()
        # The map epochs' store (see the module's docstring). Nothing is handed out until the shell
        # said what it keeps (``restored``; or ``started`` without a word: no store, no ceiling)
        self.known = False
        self.ceiling: int | None = None  # epochs up to here may be handed out: on disk (None: no store)
        self.asking = 0  # the ceiling being written (0: none)
        self.published = 0  # the epoch of the map the broker core holds (0: none)
        self.trace = broker.cfg.trace
        self.volatile = "volatile-map-epochs" in broker.cfg.breaks  # (sim/breaks.py)
        self.eager = "eager-map-epochs" in broker.cfg.breaks  # (likewise: handed out before the ceiling is on disk)

    def live_view(self) -> set[str]:
        """Members this one counts live: itself, and every peer neither down nor syncing.

        A peer not heard from since we started counts live (so a cluster that starts
        together has its full map at once) until a dial to it fails: a member that
        restarts while another is down must not take the dead one for an owner for
        ``down_after`` (it would PULL the wrong partitions, refuse the hand-offs meant
        for it and forward to the dead one)."""
        live = {self.id}
        for p, v in self.membership.peers.items():
            if v.state != "down" and v.reported != "syncing" and p not in self.unreached:
                live.add(p)
        return live

    def dial_failed(self, peer: str) -> bool:
        """A link we dialled closed before its handshake completed: whether our view changed."""
        if self.partitioned and self.membership.peers[peer].state == "unknown" and peer not in self.unreached:
            self.unreached.add(peer)
            return True
        return False

    def remap(self, now: float) -> tuple[clustermap.ClusterMap | None, set[int]] | None:
        """Compute the map of our current view and install it if its owners changed: returns
        (the map before, the partitions we gained), or None if the owners are the same."""
        new = clustermap.compute(0, self.placed, self.live_view(), self.s.partitions, self.s.replicas)
        old = self.cmap
        if old is not None and new.owners == old.owners:
            if new.live != old.live:
                self.cmap = dataclasses.replace(new, epoch=old.epoch)
                self._publish()  # (for clients)
            return None
        epoch = max(self.epoch_seen, old.epoch if old is not None else 0) + 1
        self.epoch_seen = epoch
        self.cmap = cmap = dataclasses.replace(new, epoch=epoch)
        self._publish()  # (WELCOME, REDIRECT carry it)
        gained, lost = self.own.update(epoch, cmap.owners)
        self.broker.reindex(gained, lost, now)
        primaries = sum(1 for o in cmap.owners if o and o[0] == self.id)
        self.actions.append(Log("info", "map_changed", {"epoch": epoch, "live": len(cmap.live), "primary": primaries,
                                "owned": sum(self.own.owned), "gained": len(gained), "lost": len(lost)}))  # fmt: skip
        return old, gained

    # ------------------------------------------------------------ epochs across lives

    def _publish(self) -> None:
        """Hand our map to the broker core if its epoch is within the durable ceiling; otherwise
        reserve a new block first (``persisted`` hands it out then)."""
        cmap = self.cmap
        assert cmap is not None
        if not self.known:
            return  # (before LogsRead: ``restored`` or ``started`` hands it out)
        if self.ceiling is not None and cmap.epoch > self.ceiling:
            # (one write at a time: ``persisted`` asks again if need be; past MAX_EPOCH: never handed out)
            if not self.asking and cmap.epoch <= MAX_EPOCH:
                self.asking = min(cmap.epoch + EPOCH_BLOCK - 1, MAX_EPOCH)
                self.actions.append(PersistEpochs(self.asking))
                self.actions.append(Log("info", "map_epochs_reserving", {"ceiling": self.asking}))
            if not self.eager:
                return
        self.broker.set_cluster_map(clustermap.encode(cmap), cmap.epoch)
        self.published = cmap.epoch
        if self.trace:
            self.actions.append(Trace("map_published", {"epoch": cmap.epoch}))

    def _raise_epoch(self, epoch: int) -> None:
        """Our map, its owners unchanged, at a new ``epoch`` (and handed out as ``_publish`` can)."""
        cmap = self.cmap
        assert cmap is not None and epoch > cmap.epoch
        self.epoch_seen = max(self.epoch_seen, epoch)
        self.cmap = dataclasses.replace(cmap, epoch=epoch)
        self.own.epoch = epoch  # (the owners are the same: nothing gained or lost)
        self.actions.append(Log("info", "map_epoch_raised", {"from": cmap.epoch, "epoch": epoch}))
        self._publish()

    def restored(self, stored: int) -> None:
        """The shell keeps a store, whose ceiling from our earlier lives is ``stored`` (0: none):
        from now on our epochs are above it, and a map is handed out only within a ceiling on
        disk. The map made before we knew (at construction; not handed out) gets an epoch above
        ``stored``."""
        if self.volatile:  # (a broken build: the earlier lives are forgotten)
            stored = 0
        self.known = True
        self.ceiling = stored
        self.epoch_seen = max(self.epoch_seen, stored)
        cmap = self.cmap
        if cmap is not None:
            if cmap.epoch <= stored:
                self._raise_epoch(stored + 1)
            else:
                self._publish()

    def started(self) -> None:
        """``Start``: a shell that said nothing of a store keeps none (a core run by a test):
        our epochs live in memory, and our map is handed out at once."""
        if not self.known:
            self.known = True
            self._publish()

    def persisted(self, ceiling: int, error: str) -> str | None:
        """``EpochsPersisted``: hand out the map the ceiling now covers (or reserve again). Returns
        why the member must stop (the write failed: it cannot promise its epochs), else None."""
        if error:
            return f"the map epochs' ceiling: {error}"
        if self.ceiling is None or ceiling != self.asking:
            return None  # (not ours to act on: a core only hears answers to what it asked)
        self.asking = 0
        self.ceiling = max(self.ceiling, ceiling)
        self.actions.append(Log("info", "map_epochs_reserved", {"ceiling": ceiling}))
        if self.cmap is not None and self.cmap.epoch != self.published:
            self._publish()
        return None

    def servable(self) -> bool:
        """Whether clients may be served: our map is above every epoch we heard from a peer while
        we synced (a member restarted from an old disk comes back above its peers, not below)
        and it is handed out. If not, the epoch is raised and a ceiling asked for as needed:
        ``persisted`` brings the answer, after which the member asks again."""
        cmap = self.cmap
        assert cmap is not None
        if cmap.epoch < self.epoch_seen:
            self._raise_epoch(self.epoch_seen + 1)
            cmap = self.cmap
            assert cmap is not None
        return self.published == cmap.epoch

    def gone(self, peer: str) -> bool:
        """A member whose leave is committed here."""
        return peer not in self.placed and self.roster.left(peer)

    def heard_epoch(self, epoch: int) -> None:
        if epoch > self.epoch_seen:
            self.epoch_seen = epoch

    def shared(self, peer: str) -> list[int]:
        """Partitions both this member and ``peer`` own in our map (the spanning one too)."""
        assert self.cmap is not None
        return [p for p, o in enumerate(self.cmap.owners) if self.id in o and peer in o] + [self.own.spanning]

    def owners_of(self, p: int) -> tuple[str, ...]:
        """Who keeps the registers of partition ``p``: its owners, or for the spanning
        partition (wildcard subscriptions) every member of the map."""
        assert self.cmap is not None
        if p < len(self.cmap.owners):
            return self.cmap.owners[p]
        return tuple(self.cmap.members)

    def moved(self, old: clustermap.ClusterMap) -> set[int]:
        """The partitions with an owner now that they did not have in ``old``."""
        assert self.cmap is not None
        owners = self.cmap.owners
        return {p for p in range(self.cmap.partitions) if set(owners[p]) - set(old.owners[p])}

    def new_owners(self, parts: set[int], old: clustermap.ClusterMap | None) -> dict[str, set[int]]:
        """Per peer, those of ``parts`` it owns now and did not in ``old`` (None: every owner is new)."""
        assert self.cmap is not None
        owners = self.cmap.owners
        per: dict[str, set[int]] = {}
        for p in parts:
            for m in owners[p]:
                if m != self.id and (old is None or m not in old.owners[p]):
                    per.setdefault(m, set()).add(p)
        return per

    def status(self) -> dict[str, Any]:
        cmap = self.cmap
        if cmap is None:
            return {}
        return {"epoch": cmap.epoch, "partitions": cmap.partitions, "replicas": cmap.replicas,
                "live": sorted(cmap.live), "owned": sum(self.own.owned),
                "primary": sum(1 for o in cmap.owners if o and o[0] == self.id),
                "unowned": sum(1 for o in cmap.owners if not o),
                # (the epoch clients were given, the ceiling on disk, and a write of one not answered yet:
                # a member whose disk hangs keeps clients on its last map handed out, and says so here)
                "published": self.published, "ceiling": self.ceiling, "reserving": self.asking}  # fmt: skip
