"""A deterministic simulator of a whole cluster in one process (FoundationDB style).

N member cores (cluster/member.py) and M client sessions (client/session.py)
run unchanged over a fake network, a fake disk and a fake clock, driven by a
plain event loop of our own: a heap of timed events (sim/scheduler.py). trio is
not used: its scheduler is not deterministic. Every random choice (network
delays, losses, the nemesis, each member's own random source) comes from
generators seeded by the run's seed, so a run is a function of its seed and any
failure replays: ``python scripts/simulate.py --replay SEED``.

The fake world:

* UDP (clients <-> members): each datagram is dropped, duplicated and delayed
  independently (random delays reorder them; a few wait far longer than the rest).
* TCP (members <-> members): a link delivers bytes in order and without loss
  while it is up; a partition or a crash breaks it on both sides. A dial
  across a partition gets no answer (the dialler's handshake timeout ends it);
  a dial to a crashed member is refused at once.
* Disk: a snapshot write reaches the disk only when its ``PersistDone`` is
  delivered; a crash before that loses it. A crash loses everything else. The
  durable partition logs are sim/logs.py's, the quorum's Raft state sim/raftdisk.py's
  and the map epochs' ceiling sim/epochdisk.py's (each map a member hands out is
  checked against every epoch it handed out before, in this life and earlier ones).
* Nemesis: partitions (halves, one member isolated, a bridge), heals, member
  crashes, graceful stops (last snapshot, then exit) and restarts, client
  restarts, one client cut off from one member, at seeded random times; at the end
  everything heals and restarts, and a quiet period lets the cluster settle.
  Then the clients freeze (a failover in the last instant is a change too)
  and the members get a few anti-entropy rounds before sim/check.py
  judges the run.
* Partitioned mode adds a durable workload (sim/durable.py): puts,
  gets and commits through the client's router, judged by
  sim/durablecheck.py (``durable=False`` leaves it out).

Theory of operation
-------------------
``Simulation`` is the world: the members (their cores, each fed its events and its actions
performed: ``feed``, ``_perform``), their disks and the network between everyone (``udp``,
the TCP links, partitions and cuts). What runs in that world are components, plain objects
each holding its own state and built by the simulation with what they need of it:

* ``Scheduler`` (sim/scheduler.py): the clock and the heap of events, shared by all.
* ``Accounting`` (sim/accounting.py): what the checker is told members owed, and when.
* ``ReliableWorkload`` (sim/workload.py): the publishing and subscribing clients.
* ``Nemesis`` (sim/nemesis.py): the faults, joins and leaves of the seed; it acts through
  ``Levers``, the simulation's operations on its world.
* ``DurableWorkload`` (sim/durable.py), partitioned mode: durable producers and consumers.

The network hands each datagram to whoever owns its destination address: a member (through
the accounting, which notes what the member came to owe), a reliable client, or a durable
client's session. Every draw is made in the order the simulation always made it (the
components were its mixins once): a seed runs as it did.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from typing import Any

from roost.cluster.events import (
    Accepted,
    Close,
    Dial,
    EpochsPersisted,
    Exit,
    LinkBytes,
    LinkClosed,
    LinkOpened,
    LinkSent,
    Log,
    PersistDone,
    PersistEpochs,
    RaftPersist,
    RaftPersisted,
    ReadSnapshot,
    Send,
    SendFrame,
    ServeClients,
    SnapshotRead,
    Start,
    Stop,
    Tick,
    Trace,
    WriteSnapshot,
)  # fmt: skip
from roost.cluster.member import MemberCore
from roost.cluster.partitionlog import Append, Checkpoint, ReadLog, Reload, ResetLog, Retain, Sync, Truncate
from roost.cluster.roster import decode_untrusted_roster
from sim.accounting import Accounting
from sim.check import Checker
from sim.durable import DURABLE_TRACES, DurableWorkload
from sim.epochdisk import SimEpochDisk
from sim.logs import SimLogDisk
from sim.nemesis import Levers, Nemesis
from sim.raftdisk import SimRaftDisk
from sim.scheduler import Scheduler
from sim.workload import ReliableWorkload
from sim.world import (
    FAULTS,
    PARTITIONED_TOPICS,
    TOPICS,
    WALL,
    Conn,
    SimClient,
    SimMember,
    sim_config,
)

# (durable partition logs: sim/logs.py)
LOG_ACTIONS = (Append, Sync, Checkpoint, Truncate, ResetLog, ReadLog, Retain, Reload)
Addr = tuple[str, int]


class Simulation:
    def __init__(self, seed: int, members: int = 3, clients: int = 4, faults: tuple[str, ...] = FAULTS,
                 loss: float = 0.05, dup: float = 0.02, fault_time: float = 12.0, quiet: float = 12.0,
                 sockets_guard: Callable[[], None] | None = None, mode: str = "replicated",
                 durable: bool = True, broken: str | None = None,
                 tap: Callable[[float, Addr | str, Addr | int, bytes], None] | None = None) -> None:  # fmt: skip
        """``tap``, if given, sees every datagram (now, source, destination, bytes) and every TCP
        frame (now, member, link, bytes) as it is sent, before the network decides its fate."""
        self.seed = seed
        self.rng = random.Random(seed)
        self.partitioned = mode == "partitioned"
        short = self.rng.random() < 0.35
        self.cc = sim_config(members, short=short, mode=mode,
                             partitions=self.rng.choice((4, 16, 64)) if self.partitioned else 16)  # fmt: skip
        # (every core traces for the checkers; a broken build is one its cores are told to be)
        self.cc = dataclasses.replace(self.cc, trace=True, breaks=frozenset({broken} if broken else ()))
        # (the durable logs' fsync policy: "interval" in a quarter of the seeds, from its own stream so
        # that the other draws stay; docs/durable.md says what each promises, sim/durablecheck.py checks it)
        if self.partitioned and random.Random(seed ^ 0xF5_1C).random() < 0.25:
            self.cc.settings.fsync = "interval"  # (this run's own config: sim_config makes a new one)
        self.topics = PARTITIONED_TOPICS if self.partitioned else TOPICS
        self.loss, self.dup = loss, dup
        self.faults = faults
        self.fault_time = fault_time
        self.end = fault_time + quiet
        self.settle = 2 * self.cc.settings.anti_entropy_interval + 1.0
        # (frozen clients do not ping: they must not time out while the members settle)
        assert self.settle < self.cc.node_config("m0").subscriber_timeout, "settle must be < subscriber_timeout"
        self.frozen = False  # after the end: the network carries nothing to or from clients
        self.timeout = self.cc.node_config("m0").subscriber_timeout
        self.tap = tap
        self.clock = Scheduler()
        self.check = Checker()
        self.logdisk = SimLogDisk(random.Random(seed ^ 0x10D15C))  # (its own stream: seeds without durable keep theirs)
        self.raftdisk = SimRaftDisk(random.Random(seed ^ 0x4AF7))  # (the quorum's state: likewise)
        self.epochdisk = SimEpochDisk(random.Random(seed ^ 0xE90C))  # (the map epochs' ceiling: likewise)
        # (per member: the highest map epoch it handed out, and in which of its lives: _published)
        self.published: dict[str, tuple[int, int]] = {}
        self.members = {m.id: SimMember(m.id, m.client_addr) for m in self.cc.members}
        self.member_at = {m.addr: m for m in self.members.values()}
        self.client_at: dict[Addr, SimClient] = {}
        self.conns: dict[tuple[str, int], Conn] = {}
        self.pending_dials: set[tuple[str, int]] = set()
        self.cut: set[frozenset[str]] = set()
        self.client_cuts: set[tuple[int, str]] = set()  # (client index, member id)
        self._inbound = dict.fromkeys(self.members, -1)
        self.logs: list[tuple[str, str, dict[str, Any]]] | None = None  # (member, event, fields) if wanted
        self.stats = {"crashes": 0, "stops": 0, "partitions": 0, "client_restarts": 0, "client_cuts": 0,
                      "joins": 0, "leaves": 0, "pauses": 0, "datagrams": 0, "frames": 0}  # fmt: skip
        self.left: set[str] = set()  # members whose leave was asked for: never restarted
        self.away_since: dict[str, float | None] = {}  # member -> out of touch since (see touch)
        self.clients: list[SimClient] = []
        self.accounting = Accounting(self.clock, self.check, self.clients, self.client_at, self.partitioned,
                                     self.timeout, self.feed)  # fmt: skip
        self.workload = ReliableWorkload(self.clock, self.rng, clients, self.topics, self.clients, self.client_at,
                                         self.members, self.cc, fault_time, self.partitioned, self.check,
                                         self.accounting, self.stats, self.udp)  # fmt: skip
        for m in self.members.values():
            self.clock.at(self.rng.uniform(0, 0.05), self._start_member, m)
        self.workload.begin()
        levers = Levers(partition=self.partition, heal=self.heal, cut_client=self.cut_client,
                        heal_client=self.heal_client, heal_clients=self.client_cuts.clear, crash=self.crash,
                        stop=self.stop, restart=self.restart, restart_client=self.workload.restart,
                        add_member=self.add_member, feed=self.feed, deliver=self.accounting.deliver,
                        touch=self.touch)  # fmt: skip
        self.nemesis = Nemesis(self.clock, self.rng, seed, faults, fault_time, self.partitioned, self.cc,
                               self.members, clients, self.left, self.check, self.stats, levers)  # fmt: skip
        self.nemesis.plan()
        # (durable producers and consumers: sim/durable.py)
        self.durable: DurableWorkload | None = None
        if self.partitioned and durable:
            self.durable = DurableWorkload(self.clock, seed, self.check, self.members, self.cc, fault_time,
                                           self.logdisk, self.stats, self.udp)  # fmt: skip
        # (the durable clients' addresses, and the random source for their datagrams: its own)
        self.durable_at = self.durable.sessions if self.durable is not None else {}
        self.drng = self.durable.rng if self.durable is not None else self.rng

    @property
    def now(self) -> float:
        return self.clock.now

    # ------------------------------------------------------------ event loop

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` at simulated time ``t`` (the scheduler's: tests schedule faults with it)."""
        self.clock.at(t, fn, *args)

    def run(self, max_events: int = 2_000_000) -> Checker:
        """Run to the end and judge; a run that needs more than ``max_events``
        events is itself a failure (something wakes up without progress).

        Clients may change the state up to the end (a failover is a change of
        home), so at the end they freeze (no datagrams in or out, no timers)
        and the members get ``settle`` seconds more to converge: as Jepsen
        heals, quiesces, then reads.

        Progress: what a publisher had sent halfway through the quiet period must
        be acknowledged by the end, unless its session was lost or restarted (a
        PUBACK withheld for ever stalls the publisher: review, 2026-11-24)."""
        half = (self.fault_time + self.end) / 2
        if not self.run_until(half, max_events):
            return self.check
        sent = {c.index: (c.number, c.session.last_seq) for c in self.clients if c.publisher}
        if self.durable is not None:
            self.durable.half()
        if self.run_until(self.end, max_events):
            for c in self.clients:
                number, last = sent.get(c.index, (None, 0))
                if number == c.number and not c.session.lost and c.session.acked < last:
                    self.check.violation(self.now, f"publisher {c.index} stalled: {last} sent by t={half:.1f}, "
                                                   f"acknowledged through {c.session.acked}")  # fmt: skip
            if self.durable is not None:
                self.durable.progress()
            self.frozen = True
            self.workload.freeze()
            if self.durable is not None:
                self.durable.freeze()
            if not self.run_until(self.end + self.settle, max_events):
                return self.check
            live = {m.id: m.core for m in self.members.values() if m.core is not None}
            # (a silence still going on at the end counts too, up to now: the members ran through the
            # settle while the clients were frozen. A client heard just before the freeze cannot time
            # out in it (settle < subscriber_timeout), but one silent since before, in a failover when it
            # froze, can, and it never hears so: seed 2935 --mode partitioned)
            for c in self.clients:
                if self.now - c.last_reached >= self.timeout:
                    self.check.silences.setdefault(c.cid, []).append((c.last_reached, self.now))
            subs = [(c.index, c.number, c.session) if not c.publisher else None for c in self.clients]
            st = self.cc.settings  # (two collection rounds of margin, and the members' clock spread)
            collecting = WALL + self.now - st.tombstone_horizon + 2 * st.tombstone_horizon / 10 + 0.1
            self.check.left = set(self.left)
            self.check.final(self.now, live, subs, int(collecting * 1000), self.partitioned)  # type: ignore[arg-type]
            if self.durable is not None:
                self.durable.final()
        return self.check

    def run_until(self, until: float, max_events: int = 2_000_000) -> bool:
        """Process every event up to ``until``; False if the budget ran out."""
        n, stalled = self.clock.run_until(until, max_events)
        if stalled is not None:
            self.check.violation(self.now, f"no progress: {n} events by t={self.now:.3f} (next: {stalled})")
            return False
        self.stats["events"] = self.stats.get("events", 0) + n
        return True

    # ------------------------------------------------------------ members

    def _start_member(self, m: SimMember) -> None:
        now = self.clock.now
        m.core = MemberCore(m.cc or self.cc, m.id, rng=random.Random(self.rng.getrandbits(64)), now=now,
                            wall_offset=WALL + self.rng.uniform(-0.05, 0.05), incarnation=int((WALL + now) * 1000),
                            roster=decode_untrusted_roster(m.roster))  # fmt: skip
        m.serving = False
        m.tick_at = math.inf
        # (the durable logs, the quorum's state and the map epochs' ceiling on its disk, before it starts)
        epochs = self.epochdisk.open(m.id) if self.partitioned else None
        self.feed(m, self.logdisk.read_all(m.id)._replace(quorum=self.raftdisk.open(m.id), epochs=epochs))
        self.feed(m, Start())
        self.touch()

    def feed(self, m: SimMember, ev: Any) -> None:
        core = m.core
        if core is None:
            return
        if m.paused_until > self.clock.now:
            m.backlog.append(ev)  # (the kernel holds what arrives; the core sees it later)
            return
        for a in core.handle(ev, self.clock.now):
            self._perform(m, a)
        if m.core is core:  # (not gone by an Exit just now)
            self._schedule_tick(m)

    def _schedule_tick(self, m: SimMember) -> None:
        assert m.core is not None
        d = m.core.next_deadline()
        if d < m.tick_at:
            m.tick_at = d
            self.clock.at(max(d, self.clock.now), self._tick, m, m.incarnation, d)

    def _tick(self, m: SimMember, inc: int, d: float) -> None:
        if m.incarnation != inc or m.tick_at != d:
            return  # a crash or an earlier tick made this one stale
        m.tick_at = math.inf
        self.feed(m, Tick())

    def _perform(self, m: SimMember, a: Any) -> None:
        cls = a.__class__
        if cls is Send:
            self.udp(m.addr, a.addr, a.data)
        elif cls is Log:
            if a.event == "map_changed":
                self.accounting.map_changed()
            if self.logs is not None:
                self.logs.append((m.id, a.event, a.fields))
        elif cls is SendFrame:
            self._tcp(m.id, a.link, a.data)
        elif cls is Dial:
            self._dial(m, a.link, a.peer)
        elif cls is Close:
            self._close(m.id, a.link, "closed by peer")
        elif cls is ServeClients:
            m.serving = True
        elif cls is ReadSnapshot:
            self.clock.at(self.clock.now + 0.001, self._disk_read, m, m.incarnation)
        elif cls is WriteSnapshot:
            data = b"".join(a.chunks)
            at = self.clock.now + self.rng.uniform(0.001, 0.02)
            self.clock.at(at, self._disk_written, m, m.incarnation, a.token, data)
        elif cls is Exit:
            self._gone(m)
        elif cls in LOG_ACTIONS:
            at, ev = self.logdisk.perform(m.id, a, self.clock.now)
            if ev is not None:  # (Sync, Checkpoint: not answered)
                self.clock.at(at, self._disk_answer, m, m.incarnation, ev)
        elif cls is RaftPersist:
            at = self.raftdisk.submit(m.id, a, self.clock.now)
            self.clock.at(at, self._raft_synced, m, m.incarnation, a.token)
        elif cls is PersistEpochs:
            at = self.epochdisk.submit(m.id, a.ceiling, self.clock.now)
            self.clock.at(at, self._epochs_synced, m, m.incarnation, a.ceiling)
        elif cls is Trace:  # (the cores trace: ClusterConfig.trace)
            if a.event == "map_published":
                self._published(m, a.fields["epoch"])
            elif self.durable is not None and a.event in DURABLE_TRACES:
                self.durable.traced(a)
            else:
                self.accounting.traced(m, a)

    def _disk_answer(self, m: SimMember, inc: int, ev: Any) -> None:
        if m.incarnation == inc:
            self.feed(m, ev)

    def _raft_synced(self, m: SimMember, inc: int, token: int) -> None:
        if m.incarnation == inc and self.raftdisk.complete(m.id, token):
            self.feed(m, RaftPersisted(token))

    def _epochs_synced(self, m: SimMember, inc: int, ceiling: int) -> None:
        if m.incarnation == inc and self.epochdisk.complete(m.id, ceiling):
            self.feed(m, EpochsPersisted(ceiling))

    def _published(self, m: SimMember, epoch: int) -> None:
        """A member handed a map to its clients: its epochs never go back within a life, each life's
        are above every epoch of its earlier ones, and each is within the ceiling synced on its
        disk when it is handed out (persist before act: cluster/partitionmap.py)."""
        life, top = self.published.get(m.id, (m.incarnation, 0))
        synced = self.epochdisk.synced(m.id)  # (what a power loss now would leave: the ceiling must cover it)
        if epoch > synced:
            self.check.violation(
                self.now, f"{m.id} handed out a map of epoch {epoch} above its ceiling {synced} on disk"
            )
        if epoch < top or (epoch == top and life != m.incarnation):
            when = "in this life" if life == m.incarnation else "in an earlier life"
            self.check.violation(self.now, f"{m.id} handed out a map of epoch {epoch}, after one of epoch {top} {when}")
        self.published[m.id] = (m.incarnation, max(top, epoch))

    def _disk_read(self, m: SimMember, inc: int) -> None:
        if m.incarnation == inc:
            self.feed(m, SnapshotRead(m.disk, "missing") if m.disk is None else SnapshotRead(m.disk, ""))

    def _disk_written(self, m: SimMember, inc: int, token: int, data: bytes) -> None:
        if m.incarnation == inc:  # a crash first: the write never happened
            m.disk = data
            self.feed(m, PersistDone(token, None))

    def crash(self, mid: str) -> None:
        """kill -9, and a power loss: what the member's disk had not synced is gone."""
        m = self.members[mid]
        if m.core is None:
            return
        self.stats["crashes"] += 1
        self._gone(m)
        gone = self.logdisk.power_loss(mid)
        self.raftdisk.crash(mid)
        self.epochdisk.crash(mid)
        if gone and self.cc.settings.fsync == "interval" and self.durable is not None:
            # (what was not yet due for its fsync may go)
            self.durable.power_lost(mid, gone, self.cc.settings.fsync_interval + 0.05)

    def stop(self, mid: str) -> None:
        """SIGTERM: the member writes its last snapshot and exits (``Exit``)."""
        m = self.members[mid]
        if m.core is not None and m.core.phase not in ("stopping", "stopped"):
            self.stats["stops"] += 1
            self.feed(m, Stop())
            self.touch()

    def _gone(self, m: SimMember) -> None:
        """The process is gone (crashed or exited): its memory with it, so
        what it held for subscribers is lost as by a crash (the checker's view)."""
        m.core = None
        m.serving = False
        m.incarnation += 1
        m.paused_until, m.backlog = 0.0, []
        self.check.crashes[m.id] = self.check.crashes.get(m.id, 0) + 1
        for key, conn in list(self.conns.items()):
            if key[0] == m.id:
                self._break(conn, "connection reset")
        self.pending_dials = {d for d in self.pending_dials if d[0] != m.id}
        self.touch()

    def touch(self) -> None:
        """Note when a member went out of touch (down, paused, or cut off from every other member
        that is up) for at least the tombstone horizon: what it held from before may come back
        after every other member collected the tombstone that ended it (docs/cluster.md: the
        horizon must exceed the longest partition you intend to heal from)."""
        now, horizon = self.clock.now, self.cc.settings.tombstone_horizon
        awake = {
            i
            for i, m in self.members.items()
            if m.core is not None and m.paused_until <= now and m.core.phase in ("syncing", "ready")
        }
        for i in self.members:
            since = self.away_since.get(i)
            if i in self.left or (i in awake and any(o != i and frozenset((i, o)) not in self.cut for o in awake)):
                if since is not None and now - since >= horizon and i not in self.left:
                    self.check.isolated.append(int((WALL + since) * 1000))
                self.away_since[i] = None
            elif since is None:
                self.away_since[i] = now

    def add_member(self, m: SimMember) -> None:
        """A joiner (the nemesis's JOIN was answered): in the world at its address, and started."""
        self.members[m.id] = m
        self.member_at[m.addr] = m
        self._inbound[m.id] = -1
        self._start_member(m)

    def restart(self, mid: str) -> None:
        m = self.members[mid]
        if mid in self.left:
            return
        if m.core is None:
            self._start_member(m)
        elif m.core.phase == "stopping":  # still draining: start it once it has exited
            self.clock.at(self.clock.now + 0.5, self.restart, mid)
        elif m.paused_until > self.clock.now and any(ev.__class__ is Stop for ev in m.backlog):
            # (stopped while paused: it sees the Stop only when it resumes, then drains and exits)
            self.clock.at(m.paused_until + 0.5, self.restart, mid)

    # ------------------------------------------------------------ network

    def _delay(self) -> float:
        return self.rng.uniform(0.0002, 0.003)

    def udp(self, src: Addr, dst: Addr, data: bytes) -> None:
        """Send a datagram: dropped, duplicated, delayed (the durable clients' with their own draws)."""
        if self.tap is not None:
            self.tap(self.clock.now, src, dst, data)
        durable = src in self.durable_at or dst in self.durable_at
        if self.frozen and (src in self.client_at or dst in self.client_at or durable):
            return
        if self.client_cuts:
            c = self.client_at.get(src) or self.client_at.get(dst)
            m = self.member_at.get(dst) or self.member_at.get(src)
            if c is not None and m is not None and (c.index, m.id) in self.client_cuts:
                return
        self.stats["datagrams"] += 1
        rng = self.drng if durable else self.rng  # (the durable workload's own: the other draws stay)
        r = rng.random()
        if r < self.loss:
            return
        copies = 2 if r > 1 - self.dup else 1
        for _ in range(copies):
            # a long tail: 3% of datagrams wait 50-800 ms (a queue somewhere), far behind later ones
            late = rng.uniform(0.05, 0.8) if rng.random() < 0.03 else 0.0
            at = self.clock.now + rng.uniform(0.0002, 0.003) + late
            self.clock.at(at, self._arrive, src, dst, data, self._crashes_of(src))

    def _crashes_of(self, addr: Addr) -> int:
        m = self.member_at.get(addr)
        return self.check.crashes.get(m.id, 0) if m is not None else 0

    def _arrive(self, src: Addr, dst: Addr, data: bytes, crashes: int = 0) -> None:
        m = self.member_at.get(dst)
        if m is not None:
            sender = self.client_at.get(src)
            if sender is not None and m.core is not None and m.serving:
                self.accounting.reached(sender)
            if (
                m.core is not None
                and m.serving
                and not (self.frozen and (src in self.client_at or src in self.durable_at))
            ):
                self.accounting.deliver(m, data, src)
            return
        if self.durable is not None and dst in self.durable_at:
            self.durable.arrive(dst, data, src)
            return
        c = self.client_at.get(dst)
        if c is not None and not self.frozen:
            frm = self.member_at.get(src)
            self.workload.arrive(c, data, src, frm.id if frm is not None else None, crashes)

    def _dial(self, m: SimMember, lid: int, peer: str) -> None:
        key = (m.id, lid)
        self.pending_dials.add(key)
        target = self.members.get(peer)
        if frozenset((m.id, peer)) in self.cut:
            return  # silence: the dialler's handshake timeout ends it
        # (a joiner not started yet: nothing listens at its address)
        at = self.clock.now + self._delay()
        self.clock.at(at, self._connect, key, peer, -1 if target is None else target.incarnation)

    def _connect(self, key: Addr, peer: str, inc: int) -> None:
        if key not in self.pending_dials:
            return
        self.pending_dials.discard(key)
        dialer = self.members[key[0]]
        target = self.members.get(peer)
        if target is None or target.core is None or target.incarnation != inc or frozenset((key[0], peer)) in self.cut:
            self.feed(dialer, LinkClosed(key[1], "connection refused"))
            return
        lid = self._inbound[peer]
        self._inbound[peer] -= 1
        conn = Conn([key, (peer, lid)])
        self.conns[key] = self.conns[(peer, lid)] = conn
        self.feed(target, Accepted(lid, f"{dialer.addr[0]}:0"))
        self.feed(dialer, LinkOpened(key[1]))

    def _tcp(self, mid: str, lid: int, data: bytes) -> None:
        if self.tap is not None:
            self.tap(self.clock.now, mid, lid, data)
        conn = self.conns.get((mid, lid))
        if conn is None or not conn.up:
            return
        self.stats["frames"] += 1
        d = 0 if conn.ends[0] == (mid, lid) else 1
        t = max(self.clock.now + self._delay(), conn.last[d])
        conn.last[d] = t
        self.clock.at(t, self._tcp_arrive, conn, conn.ends[1 - d], data)

    def _tcp_arrive(self, conn: Conn, end: Addr, data: bytes) -> None:
        if conn.up:
            self.feed(self.members[end[0]], LinkBytes(end[1], data))
            if conn.up:  # the sender hears its bytes are out only once the receiver has them
                sender = conn.ends[1] if conn.ends[0] == end else conn.ends[0]
                self.feed(self.members[sender[0]], LinkSent(sender[1], len(data)))

    def _close(self, mid: str, lid: int, why: str) -> None:
        self.pending_dials.discard((mid, lid))
        conn = self.conns.get((mid, lid))
        if conn is None:
            return
        conn.up = False
        for end in conn.ends:
            self.conns.pop(end, None)
        other = conn.ends[1] if conn.ends[0] == (mid, lid) else conn.ends[0]
        # the closing side's queued bytes still arrive first (FIN after data)
        t = max(self.clock.now + self._delay(), conn.last[0], conn.last[1])
        self.clock.at(t, self._feed_closed, other, why)

    def _break(self, conn: Conn, why: str) -> None:
        """A cut or a crash: both ends learn it (a crashed end hears nothing)."""
        if not conn.up:
            return
        conn.up = False
        for end in conn.ends:
            self.conns.pop(end, None)
            self.clock.at(self.clock.now + self._delay(), self._feed_closed, end, why)

    def _feed_closed(self, end: Addr, why: str) -> None:
        self.feed(self.members[end[0]], LinkClosed(end[1], why))

    def partition(self, groups: list[set[str]]) -> None:
        """Cut every pair of members that are in no group together."""
        ids = list(self.members)
        self.cut = {frozenset((a, b)) for a in ids for b in ids
                    if a < b and not any(a in g and b in g for g in groups)}  # fmt: skip
        self.stats["partitions"] += 1
        for key, conn in list(self.conns.items()):
            if frozenset((conn.ends[0][0], conn.ends[1][0])) in self.cut and key == conn.ends[0]:
                self._break(conn, "partition")
        self.touch()

    def heal(self) -> None:
        self.cut = set()
        self.touch()

    def cut_client(self, index: int, mid: str) -> None:
        """No datagram between this client and this member (both ways), until healed."""
        self.client_cuts.add((index, mid))
        self.stats["client_cuts"] += 1

    def heal_client(self, index: int, mid: str) -> None:
        self.client_cuts.discard((index, mid))


def run_seed(seed: int, **kw: Any) -> tuple[Checker, dict[str, int]]:
    sim = Simulation(seed, **kw)
    check = sim.run()
    return check, sim.stats
