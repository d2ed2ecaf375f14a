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

This is a mixin of :class:`cluster.member.MemberCore`, which owns the state.
"""

from __future__ import annotations

import math

from roost.cluster.events import Exit, ReadSnapshot, ServeClients, WriteSnapshot
from roost.cluster.memberparts import MemberParts
from roost.cluster.peerwire import PeerType, encode
from roost.cluster.snapshot import decode_untrusted_snapshot, snapshot_chunks


class Lifecycle(MemberParts):
    def _init_lifecycle(self) -> None:
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
        # Snapshots: ``persisted`` is ``state_version`` as of the last fsynced snapshot.
        self.persisted = 0
        self.roster_changes = 0  # roster changes made or learnt here: a snapshot holds the roster too
        self.writing: int | None = None
        self.write_failed = False  # the last write failed: the next waits for snapshot_interval
        self.final_snapshot = False
        self.final_done = False  # stopping: the last snapshot is written (or failed, or not needed)

    # ------------------------------------------------------------ start-up

    def _start(self) -> None:
        if self.phase != "starting":
            return
        self.phase = "syncing"
        self._log("info", "node_starting", state="syncing", peer_addr="{}:{}".format(*self.peer_addr[self.id]),
                  members=len(self.roster.members()))  # fmt: skip
        self._out.append(ReadSnapshot())
        self.pull_order = list(self.peers)
        self.rng.shuffle(self.pull_order)
        self._next_pull()

    def _next_pull(self) -> None:
        self.pull_sent = False
        self.pull_count = 0
        if not self.pull_order:
            self.pull_peer = None
            self.pull_deadline = math.inf
            self._pull_finished()
            return
        self.pull_peer = peer = self.pull_order.pop(0)
        if self._gone(peer):
            self._next_pull()
            return
        self.pull_deadline = self.now + self.s.pull_timeout
        lid = self.out[peer]
        if lid is not None and self.links[lid].up:
            self._send_pull()

    def _send_pull(self) -> None:
        assert self.pull_peer is not None
        lid = self.out[self.pull_peer]
        assert lid is not None
        self.pull_sent = True
        if self.partitioned:  # only the partitions we own (or gain), from every peer in turn
            parts = sorted(self.pull_parts) if self.pull_parts else [p for p, mine in enumerate(self.own.owned) if mine]
            self.lt.frame(lid, encode([PeerType.PULL, parts]))
        else:
            self.lt.frame(lid, encode([PeerType.PULL]))

    def _pull_failed(self, why: str, close: bool) -> None:
        peer = self.pull_peer
        if peer is None:
            return
        self._log("info", "pull_failed", peer=peer, reason=why)
        self.pull_peer = None
        lid = self.out[peer]
        if close and lid is not None:
            self._close(self.links[lid], "pull " + why)  # late DUMP frames must not arrive
        self._next_pull()

    def _pull_finished(self) -> None:
        self.pull_peer = None
        self.pull_deadline = math.inf
        if self.pull_parts:
            if self._gain_pull_finished():
                self._check_roster()
            return
        self.pull_done = True
        self._maybe_ready()

    def _on_snapshot(self, data: bytes | None, reason: str) -> None:
        if self.snapshot_done:
            return
        self.snapshot_done = True
        if data is None:
            if reason != "missing":
                self._log("error", "snapshot_unreadable", reason=reason)
        else:
            try:
                written, chunks, roster = decode_untrusted_snapshot(data)
            except ValueError as exc:
                self._log("error", "snapshot_unreadable", reason=str(exc)[:200])
            else:
                for entries in chunks:
                    self._absorb(self.broker.merge(entries, self.now))
                if self.roster.merge(roster):
                    self._roster_changed()
                age = self.now + self.wall_offset - written
                self._log("info", "loaded_snapshot", subscriptions=self.broker.index.count, age_s=round(age, 1))
        self._maybe_ready()

    def _maybe_ready(self) -> None:
        if self.phase != "syncing" or not (self.pull_done and self.snapshot_done):
            return
        if self.pulled_from is None and self.broker.index.count == 0:
            self._log("info", "started_empty", reason="no peer answered a PULL and no snapshot")
        self.phase = "ready"
        if self.partitioned:
            # What we hold of partitions we do not own (our clients' registers, from the
            # snapshot) may never have reached the owners before we went down: hand it off.
            self.replicator.hand_off(
                self.maps.new_owners({p for p, mine in enumerate(self.own.owned) if not mine}, None)
            )
        self._out.append(ServeClients())
        self._log("info", "node_ready", subscriptions=self.broker.index.count, pulled_from=self.pulled_from)
        self.replicator.ready(self.now)

    # ------------------------------------------------------------ snapshots

    def _write_snapshot(self) -> None:
        self.writing = token = self.state_version
        chunks = snapshot_chunks(self.id, self.now + self.wall_offset, self.broker.dump(), self.s.chunk_subscriptions,
                                 self.roster.encode())  # fmt: skip
        self._out.append(WriteSnapshot(token, chunks))

    @property
    def state_version(self) -> int:
        """Grows with every change a snapshot holds: registers and the roster."""
        return self.broker.changes + self.roster_changes

    def _on_persisted(self, token: int, error: str | None) -> None:
        if token != self.writing:
            return
        self.writing = None
        self.write_failed = error is not None
        if error is not None:
            self._log("error", "snapshot_failed", reason=error[:200])
        else:
            self.persisted = max(self.persisted, token)
            self._log("debug", "snapshot_written", changes=token)
            self._reply_durable()
        if self.phase == "stopping":
            if self.final_snapshot or error is not None or self.state_version == self.persisted:
                self.final_done = True
            else:
                self.final_snapshot = True
                self._write_snapshot()

    # ------------------------------------------------------------ stopping

    def _stop(self) -> None:
        if self.phase in ("stopping", "stopped"):
            return
        was_ready = self.ready
        self.phase = "stopping"
        for link in [x for x in self.links.values() if not x.outbound or not x.up]:
            self._close(link, "stopping")
        if self.writing is not None:
            return  # PersistDone decides whether one more write is needed
        if was_ready and self.state_version != self.persisted:
            self.final_snapshot = True
            self._write_snapshot()
        else:
            self.final_done = True

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
        if self.final_done and not self.links:
            self.phase = "stopped"
            self._log("info", "node_stopped", subscriptions=self.broker.index.count)
            self._out.append(Exit())
