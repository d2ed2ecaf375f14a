"""The simulator's nemesis (a mixin of sim/simulation.py's Simulation): the faults of a seed drawn
and scheduled (partitions, crashes, stops, client restarts and cuts; from their own random
sources, so that adding them left the other draws of a seed as they were: joins and leaves in
partitioned mode, and a member's loop standing still), and the admin that asks for a join or
a leave and waits for its durable answer."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from roost.cluster.config import ClusterConfig, Member
from roost.cluster.events import Tick
from roost.cluster.peerwire import PeerType
from sim.world import OWN_DRAWS, ClientDatagram, SimClient, SimMember

if TYPE_CHECKING:
    from sim.check import Checker


class Nemesis:
    if TYPE_CHECKING:  # what Simulation provides
        seed: int
        rng: random.Random
        now: float
        cc: ClusterConfig
        faults: tuple[str, ...]
        fault_time: float
        partitioned: bool
        members: dict[str, SimMember]
        member_at: dict[tuple[str, int], SimMember]
        clients: list[SimClient]
        client_cuts: set[tuple[int, str]]
        left: set[str]
        stats: dict[str, int]
        check: Checker
        _inbound: dict[str, int]

        def at(self, t: float, fn: Callable[..., None], *args: Any) -> None: ...
        def _feed(self, m: SimMember, ev: Any) -> None: ...
        def _start_member(self, m: SimMember) -> None: ...
        def partition(self, groups: list[set[str]]) -> None: ...
        def heal(self) -> None: ...
        def crash(self, mid: str) -> None: ...
        def stop(self, mid: str) -> None: ...
        def restart(self, mid: str) -> None: ...
        def cut_client(self, index: int, mid: str) -> None: ...
        def heal_client(self, index: int, mid: str) -> None: ...
        def restart_client(self, index: int) -> None: ...
        def _pub_accounting(self, m: SimMember, data: bytes, src: tuple[str, int]) -> None: ...
        def _touch(self) -> None: ...

    def _plan_nemesis(self) -> None:
        """Faults at seeded random times until fault_time; then heal, restart, settle."""
        rng = self.rng
        ids = list(self.members)
        if self.partitioned:  # (their own random source: the other faults are drawn as before)
            mrng = random.Random(self.seed * 7919 + 17)
            if "join" in self.faults and mrng.random() < 0.5:
                self.at(mrng.uniform(2.0, self.fault_time - 2.0), self.join, 0)
            if "leave" in self.faults and mrng.random() < 0.4:
                self.at(mrng.uniform(2.0, self.fault_time - 2.0), self.leave, mrng.random())
        if "pause" in self.faults:
            prng = random.Random(self.seed * 7919 + 29)
            if prng.random() < 0.3:
                self.at(prng.uniform(1.0, self.fault_time - 1.0), self.pause, prng.choice(ids), prng.uniform(0.3, 4.0))
        faults = [f for f in self.faults if f not in OWN_DRAWS]
        t = rng.uniform(1.0, 3.0)
        while t < self.fault_time and faults:
            kind = rng.choice(faults)
            if kind == "partition":
                shape = rng.choice(("halves", "isolate", "bridge"))
                order = rng.sample(ids, len(ids))
                if shape == "halves":
                    k = rng.randint(1, len(ids) - 1)
                    groups = [set(order[:k]), set(order[k:])]
                elif shape == "isolate":
                    groups = [{order[0]}, set(order[1:])]
                else:  # a bridge: order[0] talks to both sides, which cannot talk to each other
                    rest = order[1:]
                    k = max(1, len(rest) // 2)
                    groups = [{order[0], *rest[:k]}, {order[0], *rest[k:]}]
                self.at(t, self.partition, groups)
                self.at(t + rng.uniform(0.5, 4.0), self.heal)
            elif kind in ("crash", "stop"):
                victim = rng.choice(ids)
                self.at(t, self.crash if kind == "crash" else self.stop, victim)
                self.at(t + rng.uniform(0.3, 7.0), self.restart, victim)  # (past a short subscriber_timeout too)
            elif kind == "cut-client":  # one client loses one member (its home, often), for a while
                index, victim = rng.randrange(len(self.clients)), rng.choice(ids)
                self.at(t, self.cut_client, index, victim)
                self.at(t + rng.uniform(0.5, 4.0), self.heal_client, index, victim)
            else:
                self.at(t, self.restart_client, rng.randrange(len(self.clients)))
            t += rng.uniform(0.5, 3.0)
        self.at(self.fault_time, self.heal)
        self.at(self.fault_time, self.client_cuts.clear)
        for mid in ids:
            self.at(self.fault_time, self.restart, mid)
        self.at(self.fault_time, self._restart_joined)

    def _restart_joined(self) -> None:
        for mid in list(self.members):
            if mid not in self.left:
                self.restart(mid)

    def pause(self, mid: str, seconds: float) -> None:
        """The member's loop stands still for ``seconds`` (a long core call, SIGSTOP, a
        VM pause): nothing it would do happens, and what reaches it waits."""
        m = self.members[mid]
        if m.core is None or m.paused_until > self.now:
            return
        self.stats["pauses"] += 1
        m.paused_until = self.now + seconds
        self._touch()
        self.at(m.paused_until, self._resume, m, m.incarnation)

    def _resume(self, m: SimMember, inc: int) -> None:
        if m.incarnation != inc:
            return
        m.paused_until = 0.0
        backlog, m.backlog = m.backlog, []
        for ev in backlog:
            if ev.__class__ is ClientDatagram:
                if m.core is not None:
                    self._pub_accounting(m, ev.data, ev.src)
            else:
                self._feed(m, ev)
        self._feed(m, Tick())
        self._touch()  # (after the backlog: a Stop that waited in it leaves the member out of touch)

    def join(self, number: int, attempt: int = 0) -> None:
        """``roost cluster join``: a ready member takes the JOIN and answers once the change is
        on its disk; then the new member starts. An admin whose seed died first asks another."""
        ready = [
            m
            for m in self.members.values()
            if m.core is not None and m.core.ready and m.id not in self.left and m.paused_until <= self.now
        ]  # fmt: skip  (a paused member answers no admin)
        if not ready or attempt > 3:
            return
        seed = self.rng.choice(ready)
        jid = f"j{number}"
        client, peer = ("127.0.0.1", 7601 + number), ("127.0.0.1", 7701 + number)
        assert seed.core is not None
        ok, _, version = seed.core.admin_request([PeerType.JOIN, jid, list(client), list(peer)], None)
        if not ok:
            return
        roster = seed.core.roster.encode()  # (what the reply carries)
        self._feed(seed, Tick())  # (the ROSTER frames and the snapshot the JOIN made)

        def joined() -> None:
            self.stats["joins"] += 1
            self.check.join_taker[jid] = seed.id
            m = self.members[jid] = SimMember(jid, client)
            m.cc = dataclasses.replace(self.cc, members=[*self.cc.members, Member(jid, client, peer, f"/sim/{jid}")])
            m.roster = roster
            self.member_at[client] = m
            self._inbound[jid] = -1
            self._start_member(m)

        self._when_durable(seed, version, joined, lambda: self.join(number, attempt + 1))

    def leave(self, pick: float, attempt: int = 0, victim: str = "") -> None:
        """``roost cluster leave``: any ready member takes the LEAVE of a placed one."""
        ready = sorted(m.id for m in self.members.values() if m.core is not None and m.core.ready
                       and m.id not in self.left)  # fmt: skip
        if len(ready) < 3 or attempt > 3:
            return
        victim = victim or ready[int(pick * len(ready))]
        awake = [mid for mid in ready if self.members[mid].paused_until <= self.now]  # (a paused one answers no admin)
        if not awake:
            self.at(self.now + 1.0, self.leave, pick, attempt + 1, victim)
            return
        at = self.members[self.rng.choice(awake)]
        assert at.core is not None
        ok, _, version = at.core.admin_request([PeerType.LEAVE, victim], None)
        if not ok:
            return
        self._feed(at, Tick())

        def left() -> None:
            self.stats["leaves"] += 1
            self.left.add(victim)

        self._when_durable(at, version, left, lambda: self.leave(pick, attempt + 1, victim))

    def _when_durable(self, m: SimMember, version: int, done: Callable[[], None],
                      retry: Callable[[], None], inc: int | None = None) -> None:  # fmt: skip
        """The admin's wait for its reply: ``done`` once ``m`` has ``version`` on disk;
        ``retry`` (a second after, as an admin whose request timed out) if it died first."""
        inc = m.incarnation if inc is None else inc
        if m.incarnation != inc or m.core is None:
            self.at(self.now + 1.0, retry)
        elif m.core.persisted >= version:
            done()
        else:
            self.at(self.now + 0.005, self._when_durable, m, version, done, retry, inc)
