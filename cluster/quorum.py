"""A member's part in the metadata quorum of durable mode (sans-IO).

Theory of operation (docs/durable.md, "Who leads a partition")
----------------------------------------------------------------
The quorum is one Raft group (cluster/raft.py) over the peer links. Its *voters*
are the members ``[durable] quorum`` names (by default the first three of the
config); every other member is a *learner*: it receives the committed log and
applies it, but never votes. Every member applies the committed commands to its
``Metadata`` (cluster/controller.py) in the same order, so each partition's
``Leadership`` is the same everywhere once applied; ``take`` returns the
partitions whose leadership changed, which the member's durable logs then follow.

The member that leads the Raft group, while it holds the group's lease, is the
*controller*: every ``tick`` it runs ``decide`` over its map (the placed members
and those it sees live) and proposes what comes out, once per partition version
(again after ``election_timeout`` if that version is still current: a proposal
can be lost with a leader change). Partition leaders ask it for ISR changes and
new epochs with CONTROL frames (``AlterIsr``, ``Reelect``), which it checks
against the metadata and proposes; the answer is the committed leadership. A
suspect in a partition's ISR (restarted under an fsync policy that can lose
written records) sends ``Decline`` with its log's end, named or not, again each
``fetch_retry`` until it sends ``Recovered``: the controller keeps these reports
(in memory, each for ``report_ttl`` unless renewed), ``decide`` names no member
that reported, and a named leader that declines is replaced
(cluster/controller.py ``decline``).

*Contact*: a member acts on its metadata (leads, serves readers, takes puts)
only while it is in contact with the quorum: it leads the group with its lease,
or it heard the group's leader within ``election_timeout`` and has applied
everything that leader had committed then. A member on the minority side of a
partition, or restarted with an old metadata log, therefore refuses rather than
act on a leadership the quorum may have replaced (docs/durable.md).

Raft frames are ``[RAFT, *message]`` requests on our dialled link to the peer;
CONTROL frames ``[CONTROL, kind, partition, epoch, version, isr, at least]`` likewise, to
the group's leader (a DECLINE carries its log's last epoch in ``epoch`` and its end in
``at least``). The Raft state's disk work leaves as ``RaftPersist`` for the
shell (cluster/raftstore.py, the simulator's sim/raftdisk.py) and comes back as
``RaftPersisted``.
"""

from __future__ import annotations

import random
from typing import Any

from roost.cluster import controller
from roost.cluster.controller import CommandError, Leadership, Metadata, SetPartition
from roost.cluster.links import LinkTable
from roost.cluster.logactions import AlterIsr, Decline, Recovered, Reelect
from roost.cluster.peerwire import PeerProtocolError, PeerType, encode
from roost.cluster.raft import Raft
from roost.cluster.raftactions import (
    RaftApply,
    RaftPersist,
    RaftRestore,
    RaftRoleChanged,
    RaftSend,
    RaftSettings,
    RaftSnapshotWanted,
    Stored,
)
from roost.cluster.raftwire import AppendEntries, InstallSnapshot, RaftFormatError, decode_untrusted_raft
from roost.cluster.raftwire import encode as encode_raft
from roost.node.actions import Log

ALTER_ISR, REELECT, DECLINE, RECOVERED = 1, 2, 3, 4  # CONTROL kinds


class Quorum:
    def __init__(self, member_id: str, voters: tuple[str, ...], members: list[str], settings: RaftSettings,
                 partitions: int, replicas: int, rng: random.Random, links: LinkTable,
                 actions: list[Any], breaks: frozenset[str] = frozenset(),
                 report_ttl: float = 10.0) -> None:  # fmt: skip
        self.id = member_id
        self.voters = voters
        self.members = members
        self.rs = settings
        self.partitions = partitions
        self.replicas = replicas
        self.rng = rng
        self.links = links
        self._out = actions
        self.meta = Metadata()
        self.raft: Raft | None = None  # (made once the stored state is read: ``started``)
        self.heard_leader = -1e18  # when the group's leader last told us its log (a learner's contact)
        self.leader_commit = 0  # the commit it told us then
        self.leader_term = 0  # ... and its term
        self.proposed: dict[tuple[int, int], float] = {}  # (partition, version) -> when we proposed a change of it
        # controlling: partition -> member -> (its log's last epoch, end, when): the suspects in the ISR
        self.reports: dict[int, dict[str, tuple[int, int, float]]] = {}
        # (a suspect reports again each fetch_retry: a report lasts a few of those, so one a suspect cut
        # off from us no longer renews lapses, and one never renewed after a lost Recovered too)
        self.report_ttl = report_ttl
        self.live: frozenset[str] = frozenset()  # the members our map saw live at the last tick
        # (a broken build for the simulator, sim/breaks.py: the quorum's term and vote are never written,
        # and the Raft core answers before its log is on disk)
        self.stale_epoch = "stale-epoch" in breaks
        self.raft_breaks = frozenset({"raft-no-persist-wait"}) if self.stale_epoch else frozenset()

    def started(self, stored: Stored, now: float) -> set[int]:
        """The stored Raft state was read: the core starts (its snapshot is applied at once)."""
        learners = tuple(m for m in self.members if m not in self.voters)
        self.raft = Raft(self.id, self.voters, learners, self.rs, self.rng, stored, now, self.raft_breaks)
        changed: set[int] = set()
        if stored.snapshot is not None:
            changed |= self._restore(stored.snapshot)
        return changed

    # ------------------------------------------------------------ contact

    def contact(self, now: float) -> bool:
        raft = self.raft
        if raft is None:
            return False
        # (the group's leader has committed an entry of its own term: everything committed before it
        # is in the table we applied; a new leader's commit starts at its snapshot, whose table can
        # be older than what was committed before a restart: review)
        if raft.role == "leader":
            return bool(raft.lease_valid(now)) and raft.log.term_at(raft.commit_index) == raft.term
        return (now - self.heard_leader < self.rs.election_timeout and raft.applied_index >= self.leader_commit
                and raft.log.term_at(self.leader_commit) == self.leader_term)  # fmt: skip

    def leadership(self, p: int) -> Leadership | None:
        return self.meta.partitions.get(p)

    # ------------------------------------------------------------ frames

    def on_raft(self, peer: str, f: list[Any], now: float) -> set[int]:
        if self.raft is None:
            return set()
        try:
            msg = decode_untrusted_raft(f[1:], self.rs.max_command_bytes)
        except RaftFormatError as exc:
            raise PeerProtocolError(f"RAFT: {exc}") from None
        if isinstance(msg, InstallSnapshot):  # (checked before the core takes it: a bad one would be on disk)
            try:
                Metadata.restore_untrusted(msg.data)
            except CommandError as exc:
                raise PeerProtocolError(f"RAFT: InstallSnapshot: {exc}") from None
        changed = self._run(self.raft.receive(peer, msg, now), now)
        raft = self.raft
        if isinstance(msg, AppendEntries) and raft.leader == peer and msg.term == raft.term:  # (the core took it)
            self.heard_leader, self.leader_commit, self.leader_term = now, min(msg.commit, raft.last_index), msg.term
        return changed

    def on_control(self, peer: str, f: list[Any], now: float) -> set[int]:
        """A partition leader's request (AlterIsr, Reelect, Decline); taken only while we are the
        controller."""
        kind, p, epoch, version, isr, at_least = check_control_untrusted(f, self.partitions)
        if not self._controlling(now):
            return set()
        now_lead = self.meta.partitions.get(p)
        if now_lead is None:
            return set()
        if kind == RECOVERED:
            self.reports.get(p, {}).pop(peer, None)
            return set()
        if kind == DECLINE and peer in now_lead.isr:  # (a suspect's report, named or not, of any version)
            self.reports.setdefault(p, {})[peer] = (epoch, at_least, now)
        if now_lead.version != version or (kind == DECLINE and now_lead.leader != peer):
            return set()
        if kind == ALTER_ISR:
            change = controller.alter_isr(self.meta, p, peer, epoch, isr, version)
        elif kind == REELECT:
            change = controller.reelect(self.meta, p, peer, epoch, at_least)
        else:
            change = controller.decline(self.meta, p, peer, self._reports(p, now), self.live)
        return self._propose([change], now) if change is not None else set()

    def _reports(self, p: int, now: float) -> dict[str, tuple[int, int]]:
        """The fresh reports of the suspects in ``p``'s ISR (stale ones are dropped)."""
        got = self.reports.get(p)
        if not got:
            return {}
        fresh = {m: r for m, r in got.items() if now < r[2] + self.report_ttl}
        if len(fresh) != len(got):
            self.reports[p] = fresh
        return {m: (r[0], r[1]) for m, r in fresh.items()}

    def ask(self, a: AlterIsr | Reelect | Decline | Recovered, now: float) -> set[int]:
        """Our partition log's request to the controller: to ourselves, or a CONTROL frame to it."""
        lead = self.meta.partitions.get(a.partition)
        if lead is None:
            return set()
        if isinstance(a, AlterIsr):
            frame = [PeerType.CONTROL, ALTER_ISR, a.partition, a.epoch, a.version, list(a.isr), 0]
        elif isinstance(a, Reelect):
            frame = [PeerType.CONTROL, REELECT, a.partition, a.epoch, lead.version, [], a.at_least]
        elif isinstance(a, Decline):
            frame = [PeerType.CONTROL, DECLINE, a.partition, a.last_epoch, lead.version, [], a.end]
        else:
            frame = [PeerType.CONTROL, RECOVERED, a.partition, 0, lead.version, [], 0]
        if self._controlling(now):
            return self.on_control(self.id, frame, now)
        target = self.raft.leader if self.raft is not None else None
        lid = self.links.up(target) if target is not None else None
        if lid is not None:
            self.links.frame(lid, encode(frame))
        return set()

    def persisted(self, token: int, now: float) -> set[int]:
        if self.raft is None:
            return set()
        return self._run(self.raft.persisted(token, now), now)

    # ------------------------------------------------------------ time

    def tick(self, now: float, placed: list[str], live: frozenset[str]) -> set[int]:
        """The core's timers, then (controlling) the controller's round over our map."""
        if self.raft is None:
            return set()
        changed = set()
        if now >= self.raft.next_deadline():
            changed |= self._run(self.raft.tick(now), now)
        self.live = live
        if self._controlling(now) and placed:
            reports = {p: self._reports(p, now) for p in list(self.reports)}
            decisions = controller.decide(self.meta, placed, live, self.partitions, self.replicas, reports=reports)
            changed |= self._propose(decisions, now)
        elif self.reports:
            self.reports.clear()  # (not the controller: a later term's controller hears them again)
        return changed

    def deadline(self) -> float:
        return self.raft.next_deadline() if self.raft is not None else float("inf")

    def set_members(self, members: list[str], now: float) -> set[int]:
        """The roster changed: every member not a voter is a learner."""
        self.members = members
        if self.raft is None:
            return set()
        return self._run(self.raft.set_learners(tuple(m for m in members if m not in self.voters), now), now)

    # ------------------------------------------------------------ the core's actions

    def _controlling(self, now: float) -> bool:
        return self.raft is not None and self.raft.role == "leader" and self.raft.lease_valid(now)

    def _propose(self, changes: list[SetPartition], now: float) -> set[int]:
        assert self.raft is not None
        changed: set[int] = set()
        for c in changes:
            key = (c.partition, c.version)
            if now < self.proposed.get(key, -1e18) + self.rs.election_timeout:
                continue
            index, actions = self.raft.propose(c.encode(), now)
            if index is None:
                break
            self.proposed[key] = now
            changed |= self._run(actions, now)
        return changed

    def _run(self, actions: list[Any], now: float) -> set[int]:
        assert self.raft is not None
        changed: set[int] = set()
        wanted = False
        for a in actions:
            cls = a.__class__
            if cls is RaftSend:
                lid = self.links.up(a.to)
                if lid is not None:
                    self.links.frame(lid, encode([PeerType.RAFT, *encode_raft(a.msg)]))
            elif cls is RaftApply:
                p = self.meta.apply(a.index, a.command)
                if p is not None:
                    changed.add(p)
                    lead = self.meta.partitions[p]
                    self.proposed = {k: t for k, t in self.proposed.items() if k[0] != p or k[1] >= lead.version}
                    if len(lead.isr) == 1:  # (one leads alone: the others catch up from it, reports are moot)
                        self.reports.pop(p, None)
            elif cls is RaftRestore:
                changed |= self._restore(a.data)
            elif cls is RaftSnapshotWanted:
                wanted = True  # (taken once this list is done: its persists go to the shell first, in order)
            elif cls is RaftRoleChanged:
                self._out.append(Log("info", "quorum_role", {"role": a.role, "term": a.term, "leader": a.leader}))
            else:  # (RaftPersist: the shell's)
                assert cls is RaftPersist
                self._out.append(a._replace(term=0, vote=None) if self.stale_epoch else a)
        if wanted:
            changed |= self._run(self.raft.snapshot_taken(self.meta.applied, self.meta.snapshot(), now), now)
        return changed

    def _restore(self, data: bytes) -> set[int]:
        old = self.meta.partitions
        self.meta = Metadata.restore_untrusted(data)
        return {p for p in {*old, *self.meta.partitions} if old.get(p) != self.meta.partitions.get(p)}


def check_control_untrusted(f: list[Any], partitions: int) -> tuple[int, int, int, int, tuple[str, ...], int]:
    """Validate CONTROL ``[type, kind, partition, epoch, version, isr, at least]``."""
    if len(f) != 7:
        raise PeerProtocolError("malformed CONTROL")
    _, kind, p, epoch, version, isr, at_least = f
    if kind not in (ALTER_ISR, REELECT, DECLINE, RECOVERED) or kind.__class__ is not int:
        raise PeerProtocolError("CONTROL kind must be 1 (alter isr), 2 (reelect), 3 (decline) or 4 (recovered)")
    if p.__class__ is not int or not 0 <= p < partitions:
        raise PeerProtocolError("CONTROL partition out of range")
    for v in (epoch, version, at_least):
        if v.__class__ is not int or not 0 <= v < controller.EPOCH_LIMIT:
            raise PeerProtocolError("CONTROL epoch and version are integers in range")
    if isr.__class__ is not list or len(isr) > controller.MAX_REPLICAS:
        raise PeerProtocolError("CONTROL isr must be a list of member ids")
    for m in isr:
        if m.__class__ is not str or not 0 < len(m) <= controller.MAX_ID:
            raise PeerProtocolError("CONTROL isr must be a list of member ids")
    return kind, p, epoch, version, tuple(isr), at_least
