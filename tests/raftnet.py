"""A deterministic world for Raft cores (cluster/raft.py): a network, disks, crashes, and the checkers.

One heap of timed events, one clock (``Net.now``), one seeded ``random.Random``:
a seed replays exactly. Messages travel encoded (raftwire's ``encode``) and are
decoded as untrusted on arrival, with seeded delays (so reordering), drops and
duplicates, and never across a cut (``partition``). A core's ``RaftPersist``
reaches its ``Disk`` only when the (seeded, ordered) sync completes, just before
``persisted(token)``: a ``crash`` loses every persist not yet synced, and a
restart builds ``Stored`` from the disk. A paused member handles nothing until it
resumes (its events wait). Each member's deadline drives its ticks.

The checks run as the world runs and collect ``violations``: at most one leader
per term; state-machine safety (the same command at an index everywhere, and the
same state digest after a restore); a new leader holds every committed entry
(nothing committed is lost); and ahead of time, whenever the commit advances, no
voter whose synced log is as up to date as a majority's (one that could be
elected, after crashes) lacks a recently committed entry; ``lease_valid`` never
True on two members at once (checked after every event: a lease begins only at
one). ``campaign`` is one randomized run of all of it.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from dataclasses import replace
from typing import Any

from roost.cluster.raft import (
    LEADER,
    Raft,
    RaftAction,
    RaftApply,
    RaftPersist,
    RaftRestore,
    RaftRoleChanged,
    RaftSend,
    RaftSettings,
    RaftSnapshotWanted,
    Stored,
)
from roost.cluster.raftwire import decode_untrusted_raft, encode
from sim.raftdisk import RaftState

FAST = RaftSettings(election_timeout=1.0, heartbeat_interval=0.1)


def _digest(previous: bytes, command: bytes) -> bytes:
    return hashlib.blake2b(previous + command, digest_size=8).digest()


class Disk:
    """What a member has synced: the store's own state and rules (sim/raftdisk.py ``RaftState``, which
    applies a persist as cluster/raftstore.py does and refuses what it refuses), so a persist the
    real store would refuse fails the test here."""

    def __init__(self, term: int = 0, entries: list[tuple[int, bytes]] | None = None) -> None:
        self.state = RaftState(term, None, None, list(entries or []))

    def write(self, p: RaftPersist) -> None:
        self.state.apply(p, "test disk")

    def stored(self) -> Stored:
        return self.state.stored()

    @property
    def term(self) -> int:
        return self.state.term

    @property
    def entries(self) -> list[tuple[int, bytes]]:
        return self.state.entries

    @property
    def snap_index(self) -> int:
        return self.state.snapshot_index

    @property
    def snap_term(self) -> int:
        return self.state.snapshot_term


class Host:
    """A member's state machine: how far it applied and a digest of everything applied."""

    def __init__(self) -> None:
        self.applied = 0
        self.digest = b""


class Net:
    def __init__(self, seed: int, voters: int = 3, learners: int = 1, settings: RaftSettings = FAST,
                 breaks: frozenset[str] = frozenset(), drop: float = 0.0, dup: float = 0.0,
                 delay: tuple[float, float] = (0.001, 0.01), sync: tuple[float, float] = (0.0005, 0.004),
                 check_leases: bool = True, leader_crash: float = 0.0,
                 disks: dict[str, Disk] | None = None) -> None:  # fmt: skip
        self.rng = random.Random(seed)
        self.settings = settings
        self.breaks = breaks
        self.drop, self.dup, self.delay, self.sync = drop, dup, delay, sync
        self.check_leases = check_leases
        self.leader_crash = leader_crash  # how often a new leader is cut off at once or crashes soon after
        self.calm = False  # True: the scheduled faults (and restarts) are called off
        self.voters = tuple(f"v{i}" for i in range(voters))
        self.learners = tuple(f"l{i}" for i in range(learners))
        self.ids = self.voters + self.learners
        self.now = 0.0
        self.disks = {n: Disk() for n in self.ids} | (disks or {})
        self.hosts = {n: Host() for n in self.ids}
        self.cores: dict[str, Raft | None] = {}
        self.life = dict.fromkeys(self.ids, 0)
        self.pending: dict[str, list[RaftPersist]] = {n: [] for n in self.ids}
        self.sync_free = dict.fromkeys(self.ids, 0.0)
        self.tick_at: dict[str, float] = {}
        self.paused_until = dict.fromkeys(self.ids, 0.0)
        self.cuts: set[frozenset[str]] = set()
        self._heap: list[tuple[float, int, str, str, Any]] = []
        self._n = 0
        self.violations: list[str] = []
        self.leaders: dict[int, str] = {}
        self.committed: dict[int, bytes] = {}  # index -> command, as first applied anywhere
        self.digests: dict[int, bytes] = {}  # index -> the state machine's digest after it
        self.max_committed = 0
        self.commit_terms: list[tuple[int, int]] = []  # (the commit then, the highest term anywhere then)
        self.lease_holders: list[tuple[float, str]] = []
        self.applied_log: dict[str, list[tuple[int, bytes]]] = {n: [] for n in self.ids}
        self.persists_lost = 0
        self.accepted = 0  # proposals a leader took (campaign)
        self.roles: list[tuple[float, str, str, int]] = []  # (when, member, role, term) of each RaftRoleChanged
        self.restores: list[tuple[str, int]] = []  # (member, index) of each RaftRestore
        for n in self.ids:
            self.start(n)

    # -- the world ------------------------------------------------------------------------------------------

    def push(self, at: float, kind: str, node: str, payload: Any = None) -> None:
        self._n += 1
        heapq.heappush(self._heap, (at, self._n, kind, node, payload))

    def start(self, n: str) -> None:
        self.hosts[n] = Host()
        self.cores[n] = core = Raft(n, self.voters, self.learners, self.settings, random.Random(self.rng.random()),
                                    self.disks[n].stored(), self.now, self.breaks)  # fmt: skip
        self._schedule(n, core)

    def crash(self, n: str) -> None:
        """The member stops; its disk loses what was not synced."""
        if self.cores[n] is None:
            return
        self.cores[n] = None
        self.life[n] += 1
        self.persists_lost += len(self.pending[n])
        self.pending[n] = []
        self.tick_at.pop(n, None)

    def restart(self, n: str) -> None:
        if self.cores[n] is None:
            self.start(n)

    def restart_all(self) -> None:
        for n in self.ids:
            self.paused_until[n] = 0.0
            self.restart(n)

    def pause(self, n: str, seconds: float) -> None:
        self.paused_until[n] = max(self.paused_until[n], self.now + seconds)

    def partition(self, *groups: tuple[str, ...] | list[str]) -> None:
        """Cut every link between members of different groups (members in none are cut from all)."""
        where = {m: i for i, g in enumerate(groups) for m in g}
        side = {m: where.get(m, -1 - k) for k, m in enumerate(self.ids)}
        self.cuts = {frozenset((a, b)) for a in self.ids for b in self.ids if a < b and side[a] != side[b]}

    def isolate(self, n: str) -> set[frozenset[str]]:
        """Cut ``n`` from everyone (other cuts stay): the cuts added, for ``rejoin``."""
        added = {frozenset((n, m)) for m in self.ids if m != n} - self.cuts
        self.cuts |= added
        return added

    def rejoin(self, cuts: set[frozenset[str]]) -> None:
        """Undo an ``isolate`` (the cuts made since stay)."""
        self.cuts -= cuts

    def heal(self) -> None:
        self.cuts = set()

    def live(self) -> list[Raft]:
        return [c for c in self.cores.values() if c is not None]

    def leader(self) -> Raft | None:
        """The live leader with a valid lease, if any."""
        for c in self.live():
            if c.role == LEADER and c.lease_valid(self.now):
                return c
        return None

    def propose(self, n: str, command: bytes) -> int | None:
        core = self.cores[n]
        if core is None or self.paused_until[n] > self.now:
            return None
        index, actions = core.propose(command, self.now)
        self._act(n, core, actions)
        return index

    def run_until(self, until: float) -> None:
        while self._heap and self._heap[0][0] <= until:
            at, _, kind, node, payload = heapq.heappop(self._heap)
            self.now = max(self.now, at)
            self._event(kind, node, payload)
        self.now = max(self.now, until)

    def run_for(self, seconds: float) -> None:
        self.run_until(self.now + seconds)

    # -- events ---------------------------------------------------------------------------------------------

    def _event(self, kind: str, n: str, payload: Any) -> None:
        core = self.cores[n]
        if kind == "call":
            if not self.calm:
                payload()
            return
        if core is None:
            return
        if self.paused_until[n] > self.now:
            self.push(self.paused_until[n], kind, n, payload)
            return
        if kind == "msg":
            src, wire = payload
            if frozenset((src, n)) in self.cuts:
                return
            actions = core.receive(src, decode_untrusted_raft(wire), self.now)
        elif kind == "tick":
            if payload != (self.life[n], self.tick_at.get(n)):
                return  # a crashed life's, or replaced by an earlier deadline
            del self.tick_at[n]
            actions = core.tick(self.now) if core.next_deadline() <= self.now else []
        elif kind == "synced":
            life, token = payload
            if life != self.life[n]:
                return
            while self.pending[n] and self.pending[n][0].token <= token:
                self.disks[n].write(self.pending[n].pop(0))
            actions = core.persisted(token, self.now)
        elif kind == "snapshot":
            if payload != self.life[n]:
                return
            host = self.hosts[n]
            actions = core.snapshot_taken(host.applied, host.applied.to_bytes(8, "big") + host.digest, self.now)
        else:
            raise AssertionError(kind)
        self._act(n, core, actions)

    def _schedule(self, n: str, core: Raft) -> None:
        at = core.next_deadline()
        if at == float("inf"):
            return
        if n not in self.tick_at or at < self.tick_at[n]:
            self.tick_at[n] = at
            self.push(at, "tick", n, (self.life[n], at))

    def _act(self, n: str, core: Raft, actions: list[RaftAction]) -> None:
        for a in actions:
            if isinstance(a, RaftSend):
                self._send(n, a)
            elif isinstance(a, RaftPersist):
                self.pending[n].append(a)
                done = max(self.sync_free[n], self.now) + self.rng.uniform(*self.sync)
                self.sync_free[n] = done
                self.push(done, "synced", n, (self.life[n], a.token))
            elif isinstance(a, RaftApply):
                self._apply(n, a.index, a.command)
            elif isinstance(a, RaftRestore):
                self._restore(n, a.index, a.data)
            elif isinstance(a, RaftSnapshotWanted):
                self.push(self.now + 0.001, "snapshot", n, self.life[n])
            elif isinstance(a, RaftRoleChanged):
                self.roles.append((self.now, n, a.role, a.term))
                if a.role == LEADER:
                    self._new_leader(n, core, a.term)
        if self.check_leases:
            holders = [c.me for c in self.live() if c.role == LEADER and c.lease_valid(self.now)]
            if len(holders) > 1:
                self.violations.append(f"t={self.now:.4f}: leases on {holders} at once")
        self._schedule(n, core)

    def _send(self, n: str, a: RaftSend) -> None:
        if frozenset((n, a.to)) in self.cuts or self.rng.random() < self.drop:
            return
        wire = encode(a.msg)
        for _ in range(2 if self.rng.random() < self.dup else 1):
            self.push(self.now + self.rng.uniform(*self.delay), "msg", a.to, (n, wire))

    # -- the checks -----------------------------------------------------------------------------------------

    def _apply(self, n: str, index: int, command: bytes) -> None:
        host = self.hosts[n]
        if index != host.applied + 1:
            self.violations.append(f"{n}: applied {index} after {host.applied}")
        host.applied = index
        host.digest = _digest(host.digest, command)
        self.applied_log[n].append((index, command))
        known = self.committed.setdefault(index, command)
        if known != command:
            self.violations.append(f"{n}: applied {command!r} at {index}, another member applied {known!r}")
        if self.digests.setdefault(index, host.digest) != host.digest:
            self.violations.append(f"{n}: state at {index} differs from another member's")
        if index > self.max_committed:
            self.max_committed = index
            terms = [d.term for d in self.disks.values()] + [c.term for c in self.live()]
            self.commit_terms.append((index, max(terms)))  # it was committed in this term or an earlier one
            self._electable_without_committed()

    def _electable_without_committed(self) -> None:
        """Leader completeness ahead of time: a voter whose synced log is as up to date as a majority's could be
        elected (after crashes, each member has what is on its disk), so it must hold what is committed (the
        newest entries: those an unsafe commit puts at risk)."""
        top = self.max_committed
        where = {}
        for v in self.voters:
            d = self.disks[v]
            where[v] = (d.entries[-1][0] if d.entries else d.snap_term, d.snap_index + len(d.entries))
        for v in self.voters:
            if sum(1 for w in self.voters if where[w] <= where[v]) <= len(self.voters) // 2:
                continue
            d = self.disks[v]
            for index in range(max(d.snap_index + 1, top - 16), top + 1):
                k = index - d.snap_index - 1
                if k >= len(d.entries) or d.entries[k][1] != self.committed[index]:
                    self.violations.append(f"t={self.now:.4f}: {v} could be elected without committed entry {index}")
                    return

    def _restore(self, n: str, index: int, data: bytes) -> None:
        self.restores.append((n, index))
        host = self.hosts[n]
        host.applied = int.from_bytes(data[:8], "big")
        host.digest = data[8:]
        if host.applied != index:
            self.violations.append(f"{n}: restored a snapshot of {host.applied} as {index}")
        if self.digests.setdefault(index, host.digest) != host.digest:
            self.violations.append(f"{n}: restored state at {index} differs from what was applied")

    def _new_leader(self, n: str, core: Raft, term: int) -> None:
        luck = self.rng.random()
        if luck < self.leader_crash / 2:  # cut off at once: what it writes as leader stays with it
            cuts = self.isolate(n)
            self.push(self.now + self.rng.uniform(0.5, 4.0), "call", n, lambda: self.rejoin(cuts))
        elif luck < self.leader_crash:
            self.push(self.now + self.rng.uniform(0.002, 0.3), "call", n, lambda: self.crash(n))
            self.push(self.now + self.rng.uniform(0.1, 1.5), "call", n, lambda: self.restart(n))
        if self.leaders.setdefault(term, n) != n:
            self.violations.append(f"two leaders in term {term}: {self.leaders[term]} and {n}")
        # Leader completeness: an entry committed in a term is in the log of every leader of a later term (a
        # leader of an earlier term, elected late, need not hold it: it cannot commit, the majority is past it).
        top = 0
        for index, bound in reversed(self.commit_terms):
            if bound < term:
                top = index
                break
        log = core.log
        if log.last_index < top:
            self.violations.append(f"{n} leads term {term} without committed entries ({log.last_index} < {top})")
            return
        for index in range(log.base + 1, top + 1):
            if log.command(index) != self.committed[index]:
                self.violations.append(f"{n} leads term {term} with another entry at committed index {index}")
                return

    def log_matching(self) -> list[str]:
        """Log matching over the live members: the same term at an index means the same log up to it."""
        found = []
        cores = self.live()
        for i, a in enumerate(cores):
            for b in cores[i + 1 :]:
                top = min(a.log.last_index, b.log.last_index)
                low = max(a.log.base, b.log.base)
                same = False
                for index in range(top, low, -1):
                    ta, tb = a.log.term_at(index), b.log.term_at(index)
                    same = same or ta == tb
                    if same and (ta != tb or a.log.command(index) != b.log.command(index)):
                        found.append(f"{a.me} and {b.me} differ at {index} below a common entry")
                        break
        return found


CAMPAIGN = RaftSettings(election_timeout=1.0, heartbeat_interval=0.1, max_append_entries=8, snapshot_entries=40)


def campaign(seed: int, breaks: frozenset[str] = frozenset(), steps: int = 1000) -> Net:
    """One randomized run: proposals at whoever holds the lease among random faults, then a heal.

    The world, its ``violations`` what the checkers saw, and after the heal: a leader within a few election timeouts,
    a proposal there committed on every member, every member at the same applied state, log matching.
    """
    r = random.Random(seed)
    settings = CAMPAIGN if r.random() < 0.5 else replace(CAMPAIGN, max_append_entries=1)
    net = Net(seed, voters=r.choice((3, 5)), learners=r.choice((1, 2)), settings=settings, breaks=breaks, drop=0.03,
              dup=0.03, delay=(0.001, 0.02), sync=(0.001, 0.01), leader_crash=r.choice((0.0, 0.5, 0.8)))  # fmt: skip
    for step in range(steps):
        leader = net.leader()
        if leader is not None and net.propose(leader.me, b"%d:%d" % (seed, step)) is not None:
            net.accepted += 1
        fault = r.random()
        victim = r.choice(net.ids)
        if fault < 0.004:
            net.crash(victim)
            net.push(net.now + r.uniform(0.05, 2.0), "call", victim, lambda v=victim: net.restart(v))
        elif fault < 0.01:  # crash a member with writes not synced yet (they are lost)
            busy = [n for n in net.ids if net.pending[n]]
            if busy:
                v = r.choice(busy)
                net.crash(v)
                net.push(net.now + r.uniform(0.01, 0.5), "call", v, lambda v=v: net.restart(v))
        elif fault < 0.014:
            side = r.sample(net.ids, r.randint(1, len(net.ids) - 1))
            net.partition(side, [n for n in net.ids if n not in side])
            net.push(net.now + r.uniform(0.3, 3.0), "call", victim, net.heal)
        elif fault < 0.017:
            net.pause(victim, r.uniform(0.1, 2.0))
        elif fault < 0.021 and leader is not None:  # cut the leader off: it appends what it cannot replicate
            cuts = net.isolate(leader.me)
            net.push(net.now + r.uniform(0.3, 2.5), "call", victim, lambda c=cuts: net.rejoin(c))
        try:
            net.run_for(0.02)
        except AssertionError as e:  # a core's own assertion (a committed entry cut)
            net.violations.append(f"assertion: {e}")
        if net.violations:
            return net
    net.heal()
    net.calm = True
    net.leader_crash = net.drop = net.dup = 0.0
    net.restart_all()
    net.run_for(6 * CAMPAIGN.election_timeout)
    leader = net.leader()
    if leader is None:
        net.violations.append("no leader with a lease after the heal")
        return net
    index = net.propose(leader.me, b"final")
    net.run_for(2.0)
    net.violations += net.log_matching()
    if index is None or net.committed.get(index) != b"final":
        net.violations.append(f"the proposal after the heal was not committed ({index})")
    states = {(net.hosts[n].applied, net.hosts[n].digest) for n in net.ids}
    if len(states) != 1:
        net.violations.append(f"members differ after the heal: {sorted((n, net.hosts[n].applied) for n in net.ids)}")
    return net
