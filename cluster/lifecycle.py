"""A member's life: start-up (snapshot and PULL, then ready), snapshots, and stopping (sans-IO).

Theory of operation
-------------------
``Start`` reads our own snapshot (``ReadSnapshot``) and PULLs a full dump from
one peer after another, in an order drawn from the member's random source,
until one answers with a complete dump (in partitioned mode: the partitions
we own, from every peer in turn, since each holds only its own); a peer that is syncing itself answers
``DUMPEND -1`` and the next is tried; ``pull_timeout`` or a dropped link moves
on too. Merges commute, so the snapshot and the dump may arrive in either
order. With both done (or every peer tried) the member is ready and the
runner binds the client port (``ServeClients``).

Snapshots: every ``snapshot_interval``, if the registers changed since the
last fsynced snapshot, the state goes out as one ``WriteSnapshot``; only its
``PersistDone`` moves ``persisted``. One write at a time.

``Stop`` (SIGTERM) drains before it exits: the member stops taking client
datagrams (a client that gets no answer fails over) and closes the links
peers dialled, but keeps each link it dialled until its push queue is empty,
so changes it acknowledged reach the peers; a link that goes silent is
closed by its deadline (``down_after``), and the runner's
``stop_timeout`` bounds the whole. It writes a last snapshot, and ``Exit``s
when that is on disk (or failed) and no dialled link is left::

    starting --Start--> syncing --pull done and snapshot read--> ready
    syncing|ready --Stop--> stopping --last snapshot done, pushes drained--> stopped

The member's phase is its own; :class:`Lifecycle` is the component that holds the PULL in
progress (also the gain pulls of cluster/joining.py) and the snapshots, and answers the member's
calls with what it must do next (a pull finished, a write done). The links, the map, the broker
core, the roster and the action list are shared with the member.
"""

from __future__ import annotations

import math
from typing import Any

from roost.cluster.config import ClusterSettings
from roost.cluster.events import WriteSnapshot
from roost.cluster.links import LinkTable
from roost.cluster.partitionmap import PartitionMap
from roost.cluster.peerwire import PeerType, encode
from roost.cluster.roster import Roster
from roost.cluster.snapshot import decode_untrusted_snapshot, snapshot_chunks
from roost.node.actions import Log
from roost.node.core import BrokerCore


class Lifecycle:
    def __init__(self, member_id: str, s: ClusterSettings, wall_offset: float, now: float, broker: BrokerCore,
                 roster: Roster, links: LinkTable, maps: PartitionMap, actions: list[Any]) -> None:  # fmt: skip
        self.id = member_id
        self.s = s
        self.partitioned = s.mode == "partitioned"
        self.wall_offset = wall_offset
        self.broker = broker
        self.roster = roster
        self.links = links
        self.maps = maps
        self._out = actions
        # PULL
        self.pull_order: list[str] = []
        self.pull_parts: set[int] = set()  # a running member's gains (cluster/joining.py); empty: all we own
        self.pull_base = 0  # the committed roster when that gain pull began
        self.pull_peer: str | None = None
        self.pull_ok: set[str] = set()  # peers that answered a gain PULL completely
        self.pull_from: dict[int, set[str]] = {}  # gain -> the peers it is pulled from
        self.pull_sent = False
        self.pull_deadline = math.inf
        self.pull_count = 0
        self.pull_done = False
        self.pulled_from: str | None = None
        self.snapshot_done = False
        # Snapshots: ``persisted`` is the member's ``state_version`` as of the last fsynced snapshot.
        self.next_snapshot = now + s.snapshot_interval
        self.persisted = 0
        self.writing: int | None = None
        self.write_failed = False  # the last write failed: the next waits for snapshot_interval
        self.final_snapshot = False
        self.final_done = False  # stopping: the last snapshot is written (or failed, or not needed)

    def _log(self, level: str, event: str, **fields: Any) -> None:
        self._out.append(Log(level, event, fields))

    # ------------------------------------------------------------ PULL

    def next_pull(self, now: float) -> bool:
        """PULL from the next peer in order (members only); True when none is left."""
        self.pull_sent = False
        self.pull_count = 0
        while True:
            if not self.pull_order:
                self.pull_peer = None
                self.pull_deadline = math.inf
                return True
            self.pull_peer = peer = self.pull_order.pop(0)
            if not self.maps.gone(peer):
                break
        self.pull_deadline = now + self.s.pull_timeout
        if self.links.up(peer) is not None:
            self.send_pull()
        return False

    def send_pull(self) -> None:
        assert self.pull_peer is not None
        lid = self.links.out[self.pull_peer]
        assert lid is not None
        self.pull_sent = True
        if self.partitioned:  # only the partitions we own (or gain), from every peer in turn
            owned = self.maps.own.owned
            parts = sorted(self.pull_parts) if self.pull_parts else [p for p, mine in enumerate(owned) if mine]
            self.links.frame(lid, encode([PeerType.PULL, parts]))
        else:
            self.links.frame(lid, encode([PeerType.PULL]))

    def pull_failed(self, why: str) -> str | None:
        """The PULL in progress failed: the peer it went to (None: none was in progress). The
        member closes that link if late DUMP frames must not arrive, and moves to the next."""
        peer = self.pull_peer
        if peer is not None:
            self._log("info", "pull_failed", peer=peer, reason=why)
            self.pull_peer = None
        return peer

    def pulling(self, peer: str) -> bool:
        """Is our PULL to ``peer`` sent and not yet answered?"""
        return self.pull_peer == peer and self.pull_sent

    def dumped(self, entries: list[Any]) -> None:
        self.pull_count += sum(len(e[5]) for e in entries)

    def pulled(self, peer: str) -> None:
        """``peer`` answered the whole PULL."""
        self._log("info", "pulled", peer=peer, subscriptions=self.pull_count)
        self.pulled_from = peer
        self.pull_ok.add(peer)

    def pull_finished(self) -> bool:
        """No peer is left to pull from: True if that was a gain pull (the member checks what it
        got, ``gains_pulled``), else the start-up pull is done."""
        self.pull_peer = None
        self.pull_deadline = math.inf
        if self.pull_parts:
            return True
        self.pull_done = True
        return False

    def pull_gains(self, gains: set[int], committed: int, peers: list[str]) -> None:
        """PULL the gains from every live peer that owns some of them now, one after another."""
        cmap = self.maps.cmap
        assert cmap is not None
        owners = cmap.owners
        self.pull_parts = gains
        self.pull_base = committed
        self.pull_order = [p for p in peers if p in cmap.live and any(p in owners[g] for g in gains)]
        self.pull_ok = set()
        # (the members each gain is pulled from; one with none live has nothing to pull)
        self.pull_from = {g: set(owners[g]) & set(self.pull_order) for g in gains}
        self._log("info", "pulling_gains", partitions=len(gains), peers=len(self.pull_order))

    def gains_pulled(self, committed: int) -> tuple[set[int], set[int]]:
        """The gain pull ended: (the gains pulled, the gains missed). A gain counts as pulled once
        one of its owners answered the whole PULL; none does if a roster was committed since
        (those gains were another roster's; review)."""
        missed = {g for g in self.pull_parts if self.pull_from[g] and not self.pull_from[g] & self.pull_ok}
        got = self.pull_parts - missed if self.pull_base == committed else set()
        self.pull_parts = set()
        if missed:
            self._log("warning", "gains_missed", partitions=len(missed))
        return got, missed

    def paused(self, stood: float) -> None:
        self.pull_deadline += stood

    # ------------------------------------------------------------ snapshots

    def snapshot_read(self, data: bytes | None, reason: str) -> tuple[float, list[Any], Any] | None:
        """Our snapshot at start-up: (written at, chunks of entries, roster entries) to merge, or
        None (missing, unreadable: logged)."""
        self.snapshot_done = True
        if data is None:
            if reason != "missing":
                self._log("error", "snapshot_unreadable", reason=reason)
            return None
        try:
            written, chunks, roster = decode_untrusted_snapshot(data)
        except ValueError as exc:
            self._log("error", "snapshot_unreadable", reason=str(exc)[:200])
            return None
        return written, list(chunks), roster

    def snapshot_due(self, now: float, ready: bool, version: int, admin_waiting: bool) -> None:
        """The snapshot timer: our state goes to disk if it changed (``version``: the member's
        ``state_version``); at once while an admin reply waits for its change to be on disk,
        unless the last write failed."""
        if now >= self.next_snapshot or (admin_waiting and not self.write_failed):
            if now >= self.next_snapshot:
                self.next_snapshot = now + self.s.snapshot_interval
            if ready and self.writing is None and version != self.persisted:
                self.write(version, now)

    def write(self, version: int, now: float) -> None:
        """Our state as of ``version`` (the member's ``state_version``) goes to disk."""
        self.writing = version
        chunks = snapshot_chunks(self.id, now + self.wall_offset, self.broker.dump(), self.s.chunk_subscriptions,
                                 self.roster.encode())  # fmt: skip
        self._out.append(WriteSnapshot(version, chunks))

    def written(self, token: int, error: str | None) -> bool | None:
        """``PersistDone``: True if our snapshot ``token`` is on disk now (admin replies may go),
        False if its write failed, None if it was no write of ours."""
        if token != self.writing:
            return None
        self.writing = None
        self.write_failed = error is not None
        if error is not None:
            self._log("error", "snapshot_failed", reason=error[:200])
            return False
        self.persisted = max(self.persisted, token)
        self._log("debug", "snapshot_written", changes=token)
        return True

    def last_write(self, failed: bool, version: int, now: float) -> None:
        """Stopping, a write ended: one more if the state changed meanwhile, else we are done."""
        if self.final_snapshot or failed or version == self.persisted:
            self.final_done = True
        else:
            self.final_snapshot = True
            self.write(version, now)

    def stopping(self, was_ready: bool, version: int, now: float) -> None:
        """``Stop``: a last snapshot if we served and it changed (after the write in progress)."""
        if self.writing is not None:
            return  # PersistDone decides whether one more write is needed
        if was_ready and version != self.persisted:
            self.final_snapshot = True
            self.write(version, now)
        else:
            self.final_done = True
