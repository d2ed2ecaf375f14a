"""The simulator's nemesis (sim/simulation.py's ``Nemesis`` component): the faults of a seed, drawn
and scheduled, and the admin that asks for joins and leaves.

Theory of operation
-------------------
At construction ``plan`` draws every fault of the run up to ``fault_time`` and schedules it on
the simulation's clock: partitions (halves, one member isolated, a bridge) and their heals,
member crashes and graceful stops and their restarts, client restarts, one client cut off from
one member for a while. At ``fault_time`` everything heals and every member that has not left
restarts. The faults come from the run's main random source, in the order they always did;
those added later come from random sources of their own, so that adding them left the other
draws of a seed as they were: joins and leaves (partitioned mode) and a member's loop standing
still (``pause``: what reaches it meanwhile waits in its backlog, handed to it on ``_resume``).

A join or a leave is an admin's request to a ready member (``MemberCore.admin_request``), which
answers once the change is on its disk (``_when_durable``); a joiner starts only then, and an
admin whose member died first asks another.

The nemesis holds no world of its own: it reads the members (a joiner is added to them through
``Levers.add_member``) and acts through ``Levers``, the simulation's operations on its world,
given at construction.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from roost.cluster.config import ClusterConfig, Member
from roost.cluster.events import Tick
from roost.cluster.peerwire import PeerType
from sim.check import Checker
from sim.scheduler import Scheduler
from sim.world import OWN_DRAWS, ClientDatagram, SimMember


@dataclass(frozen=True)
class Levers:
    """What the nemesis acts on the world with: the simulation's operations (sim/simulation.py)
    and the reliable workload's client restart (sim/workload.py)."""

    partition: Callable[[list[set[str]]], None]  # cut every pair of members in no group together
    heal: Callable[[], None]  # ... and end every cut
    cut_client: Callable[[int, str], None]  # no datagram between a client and a member
    heal_client: Callable[[int, str], None]
    heal_clients: Callable[[], None]  # end every client's cut
    crash: Callable[[str], None]  # kill -9 and a power loss
    stop: Callable[[str], None]  # SIGTERM
    restart: Callable[[str], None]  # a member that is down (and has not left) starts again
    restart_client: Callable[[int], None]  # a client process dies and starts again
    add_member: Callable[[SimMember], None]  # a joiner is there, and starts
    feed: Callable[[SimMember, Any], None]  # a member's core takes an event (its actions performed)
    deliver: Callable[[SimMember, bytes, tuple[str, int]], None]  # ... a client datagram (accounted)
    touch: Callable[[], None]  # who is out of touch may have changed


class Nemesis:
    def __init__(self, clock: Scheduler, rng: random.Random, seed: int, faults: tuple[str, ...],
                 fault_time: float, partitioned: bool, cc: ClusterConfig, members: dict[str, SimMember],
                 n_clients: int, left: set[str], check: Checker, stats: dict[str, int],
                 levers: Levers) -> None:  # fmt: skip
        self.clock = clock
        self.rng = rng  # (the run's main source: the faults are drawn from it, then the admins' picks)
        self.seed = seed
        self.faults = faults
        self.fault_time = fault_time
        self.partitioned = partitioned
        self.cc = cc
        self.members = members  # (the simulation's: a joiner is added to it)
        self.n_clients = n_clients  # how many reliable clients there are (a restart or a cut picks one)
        self.left = left  # (the simulation's: members whose leave was asked for, never restarted)
        self.check = check
        self.stats = stats
        self.do = levers  # (what it acts on the world with)

    def plan(self) -> None:
        """Faults at seeded random times until fault_time; then heal, restart, settle."""
        rng = self.rng
        ids = list(self.members)
        if self.partitioned:  # (their own random source: the other faults are drawn as before)
            mrng = random.Random(self.seed * 7919 + 17)
            if "join" in self.faults and mrng.random() < 0.5:
                self.clock.at(mrng.uniform(2.0, self.fault_time - 2.0), self.join, 0)
            if "leave" in self.faults and mrng.random() < 0.4:
                self.clock.at(mrng.uniform(2.0, self.fault_time - 2.0), self.leave, mrng.random())
        if "pause" in self.faults:
            prng = random.Random(self.seed * 7919 + 29)
            if prng.random() < 0.3:
                t, victim = prng.uniform(1.0, self.fault_time - 1.0), prng.choice(ids)
                self.clock.at(t, self.pause, victim, prng.uniform(0.3, 4.0))
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
                self.clock.at(t, self.do.partition, groups)
                self.clock.at(t + rng.uniform(0.5, 4.0), self.do.heal)
            elif kind in ("crash", "stop"):
                victim = rng.choice(ids)
                self.clock.at(t, self.do.crash if kind == "crash" else self.do.stop, victim)
                # (past a short subscriber_timeout too)
                self.clock.at(t + rng.uniform(0.3, 7.0), self.do.restart, victim)
            elif kind == "cut-client":  # one client loses one member (its home, often), for a while
                index, victim = rng.randrange(self.n_clients), rng.choice(ids)
                self.clock.at(t, self.do.cut_client, index, victim)
                self.clock.at(t + rng.uniform(0.5, 4.0), self.do.heal_client, index, victim)
            else:
                self.clock.at(t, self.do.restart_client, rng.randrange(self.n_clients))
            t += rng.uniform(0.5, 3.0)
        self.clock.at(self.fault_time, self.do.heal)
        self.clock.at(self.fault_time, self.do.heal_clients)
        for mid in ids:
            self.clock.at(self.fault_time, self.do.restart, mid)
        self.clock.at(self.fault_time, self._restart_joined)

    def _restart_joined(self) -> None:
        for mid in list(self.members):
            if mid not in self.left:
                self.do.restart(mid)

    def pause(self, mid: str, seconds: float) -> None:
        """The member's loop stands still for ``seconds`` (a long core call, SIGSTOP, a
        VM pause): nothing it would do happens, and what reaches it waits."""
        m = self.members[mid]
        if m.core is None or m.paused_until > self.clock.now:
            return
        self.stats["pauses"] += 1
        m.paused_until = self.clock.now + seconds
        self.do.touch()
        self.clock.at(m.paused_until, self._resume, m, m.incarnation)

    def _resume(self, m: SimMember, inc: int) -> None:
        if m.incarnation != inc:
            return
        m.paused_until = 0.0
        backlog, m.backlog = m.backlog, []
        for ev in backlog:
            if ev.__class__ is ClientDatagram:
                if m.core is not None:
                    self.do.deliver(m, ev.data, ev.src)
            else:
                self.do.feed(m, ev)
        self.do.feed(m, Tick())
        self.do.touch()  # (after the backlog: a Stop that waited in it leaves the member out of touch)

    def join(self, number: int, attempt: int = 0) -> None:
        """``roost cluster join``: a ready member takes the JOIN and answers once the change is
        on its disk; then the new member starts. An admin whose seed died first asks another."""
        ready = [
            m
            for m in self.members.values()
            if m.core is not None and m.core.ready and m.id not in self.left and m.paused_until <= self.clock.now
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
        self.do.feed(seed, Tick())  # (the ROSTER frames and the snapshot the JOIN made)

        def joined() -> None:
            self.stats["joins"] += 1
            self.check.join_taker[jid] = seed.id
            m = SimMember(jid, client)
            m.cc = dataclasses.replace(self.cc, members=[*self.cc.members, Member(jid, client, peer, f"/sim/{jid}")])
            m.roster = roster
            self.do.add_member(m)

        self._when_durable(seed, version, joined, lambda: self.join(number, attempt + 1))

    def leave(self, pick: float, attempt: int = 0, victim: str = "") -> None:
        """``roost cluster leave``: any ready member takes the LEAVE of a placed one."""
        ready = sorted(m.id for m in self.members.values() if m.core is not None and m.core.ready
                       and m.id not in self.left)  # fmt: skip
        if len(ready) < 3 or attempt > 3:
            return
        victim = victim or ready[int(pick * len(ready))]
        now = self.clock.now
        awake = [mid for mid in ready if self.members[mid].paused_until <= now]  # (a paused one answers no admin)
        if not awake:
            self.clock.at(now + 1.0, self.leave, pick, attempt + 1, victim)
            return
        at = self.members[self.rng.choice(awake)]
        assert at.core is not None
        ok, _, version = at.core.admin_request([PeerType.LEAVE, victim], None)
        if not ok:
            return
        self.do.feed(at, Tick())

        def has_left() -> None:
            self.stats["leaves"] += 1
            self.left.add(victim)

        self._when_durable(at, version, has_left, lambda: self.leave(pick, attempt + 1, victim))

    def _when_durable(self, m: SimMember, version: int, done: Callable[[], None],
                      retry: Callable[[], None], inc: int | None = None) -> None:  # fmt: skip
        """The admin's wait for its reply: ``done`` once ``m`` has ``version`` on disk;
        ``retry`` (a second after, as an admin whose request timed out) if it died first."""
        inc = m.incarnation if inc is None else inc
        if m.incarnation != inc or m.core is None:
            self.clock.at(self.clock.now + 1.0, retry)
        elif m.core.persisted >= version:
            done()
        else:
            self.clock.at(self.clock.now + 0.005, self._when_durable, m, version, done, retry, inc)
