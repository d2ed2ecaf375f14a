"""The simulator's durable workload (sim/simulation.py's ``DurableWorkload`` component): puts, gets
and commits over the real client code, and the hooks that tell sim/durablecheck.py what members did.

Theory of operation (docs/durable.md, "What the simulator checks")
-----------------------------------------------------------------
Every partitioned seed runs, beside the reliable workload, a durable one on topics of its own
(``DURABLE_TOPICS``), drawn from a random source of its own (``drng``: the other draws of a seed
stay as they were, though the members' traffic around them changes): one durable client, and a
second one in a third of the seeds (``SECOND_CLIENT``: more would cost too much per seed).

* Each client is a client/router.py ``Router`` driven as client/library.py drives it: every
  session the router opens with an address of its own, each datagram fed to ``handle_datagrams``
  of its session, ``tick`` at the session's or the put streams' deadline.
* It puts to every durable topic (``Router.put``: a go-back-N stream per partition,
  client/putter.py). A PUTACK that moves a stream's acknowledged sequence acknowledges those puts
  (the checker's promise).
* It reads one topic with the library's own durable core (client/durableclient.py's
  ``Reader``, the one ``get`` and ``commit`` drive): GET from the offset read to, keep the
  records at or past it, COMMIT what was read to, resend after 5 x ``pub_retry`` without an
  answer or ``pub_retry`` after a refusal, at the session of the topic's primary then; between
  rounds it waits (``POLL_EVERY``). Now and then the process dies after it got records and
  before it processed and committed them; its next process starts from the cluster's cursor
  and must get them again. The application de-duplicates by offset (as with an offsets file):
  the checker sees every record it processed.
* Processes also die and restart at random times; a new process puts under a new producer id
  (what its old process had not had acknowledged is not promised).
* What the members did comes as their ``Trace`` actions (cluster/durable.py, emitted because the
  simulation's ClusterConfig says ``trace``): every record a leader commits, with the members
  holding it on disk then (the leader and the followers whose fetches passed it); every leader's
  start, seen as the Append of its EPOCH record, with its view of the live members and its log's
  epochs; every cursor a leader reads a GET from, and every range of records it answers one with.

At the freeze (``freeze``) they stop with the other clients. ``progress`` checks that what a
process had put by the middle of the quiet period (``half``) is acknowledged by the end, and the
final judgement is ``DurableCheck.final`` (``final``).

The workload holds its clients, their sessions' addresses (``sessions``: the simulation's
network hands a datagram to such an address to ``arrive``), its random source and its checker;
it sends through the simulation's ``send`` and reads the members and their disks, given at
construction.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from roost.client import ring
from roost.client.durableclient import DurableClient as DurableCore
from roost.client.durableclient import Reader
from roost.client.router import Router
from roost.client.session import ClientConfig, ClientSession
from roost.cluster.config import ClusterConfig
from roost.node.actions import Trace
from roost.node.segmentlog import Record
from sim.check import Checker
from sim.durablecheck import DurableCheck
from sim.logs import SimLogDisk
from sim.scheduler import Scheduler
from sim.world import WALL, SimMember

Addr = tuple[str, int]
DURABLE_TOPICS = ("d0", "d1", "d2")
DURABLE_TRACES = frozenset({"committed", "cursor_served", "records_served"})  # (traced)
# Durable client processes: each puts to every durable topic and reads one; a second one in a
# third of the seeds (two writers to a partition, two cursors in it), one otherwise (the cost of
# a seed: scripts/simulate.py campaigns run 10,000 of them)
SECOND_CLIENT = 1 / 3
PUT_EVERY = (0.15, 0.45)  # seconds between a client's puts
POLL_EVERY = (0.3, 0.7)  # seconds between a consumer's GETs once it has committed (or got nothing new)
MOST = 50  # records per GET
CRASH_BEFORE_COMMIT = 0.05  # a consumer dies between its records and its COMMIT


@dataclass
class DurableClient:
    """One durable client (a producer and a consumer), across its processes (``number`` counts them)."""

    index: int
    topic: str = ""  # the topic it reads
    name: str = ""  # ... its durable subscription's name
    did: bytes = b""  # ... and durable id (the same in every process)
    router: Router | None = None
    number: int = 0
    addrs: dict[int, Addr] = field(default_factory=dict)  # id(session) -> its address
    tick_at: float = math.inf
    next_msg: int = 1  # a producer's next message number
    acked: dict[int, int] = field(default_factory=dict)  # partition -> acknowledged sequence heard
    marks: dict[int, int] | None = None  # puts made by the middle of the quiet period (progress)
    reader: Reader | None = None  # the consumer (this process's: client/durableclient.py)
    # the consumer's next round, "get" or "commit", and when it starts (inf: one is under way)
    want: str = "get"
    deadline: float = math.inf
    p: int = 0


class DurableWorkload:
    def __init__(self, clock: Scheduler, seed: int, check: Checker, members: dict[str, SimMember],
                 cc: ClusterConfig, fault_time: float, logdisk: SimLogDisk, stats: dict[str, int],
                 send: Callable[[Addr, Addr, bytes], None]) -> None:  # fmt: skip
        self.clock = clock
        self.check = check
        self.members = members  # (the simulation's, joiners too)
        self.cc = cc
        self.fault_time = fault_time
        self.logdisk = logdisk  # (the members' durable logs: the final judgement reads them)
        self.stats = stats
        self.send = send  # (the simulation's network: a datagram from a session's address)
        self.frozen = False  # after the end: no datagrams in or out, no timers (``freeze``)
        self.rng = random.Random(seed * 7919 + 43)  # (its own source: the other draws stay)
        self.dcheck = DurableCheck(check)
        self.sessions: dict[Addr, tuple[DurableClient, ClientSession]] = {}  # address -> its client, session
        self.clients: list[DurableClient] = []
        self._ports = 0
        self._readers: dict[str, int] = {}  # durable name -> consumer index
        rng = self.rng
        parts = self.cc.settings.partitions
        for i in range(2 if rng.random() < SECOND_CLIENT else 1):
            dc = DurableClient(i, rng.choice(DURABLE_TOPICS), f"reader{i}", rng.randbytes(16))
            dc.p = ring.partition_of(dc.topic, parts)
            self._readers[dc.name] = i
            self.dcheck.consumer(i, dc.topic, dc.p)
            self.clients.append(dc)
            self.clock.at(rng.uniform(0.5, 1.5), self._start, dc, 0)
        t = rng.uniform(1.0, 6.0)
        while t < self.fault_time:  # (processes that die and start again, now and then)
            self.clock.at(t, self._restart, rng.randrange(len(self.clients)))
            t += rng.uniform(3.0, 10.0)

    def freeze(self) -> None:
        """The end: the clients neither send nor receive, and their timers stop."""
        self.frozen = True

    def power_lost(self, member: str, gone: list[tuple[int, Record, float]], within: float) -> None:
        """A crash took ``gone`` from ``member``'s disk (fsync = interval): what was written less
        than ``within`` before may be missing (DurableCheck.power_lost)."""
        self.dcheck.power_lost(member, gone, self.clock.now, within)

    # ------------------------------------------------------------ processes

    def _start(self, dc: DurableClient, number: int) -> None:
        if dc.number != number:
            return
        dc.number += 1
        rng = self.rng
        ids = list(self.members)
        order = rng.sample(ids, len(ids))
        addrs = [self.members[i].addr for i in order]
        cfg = ClientConfig(breaks=self.cc.breaks)
        dc.router = Router(rng.randbytes(16), rng.randbytes(16), rng.randbytes(16), cfg, self.clock.now,
                           node=addrs[0], members=addrs[1:],
                           session=int((WALL + self.clock.now) * 1000) + dc.number)  # fmt: skip
        dc.addrs, dc.acked, dc.marks, dc.tick_at = {}, {}, None, math.inf
        dc.reader = DurableCore(cfg).reader(dc.router, "sim", dc.name, dc.topic, dc.p, did=dc.did)
        dc.want, dc.deadline = "get", self.clock.now
        self.clock.at(self.clock.now + rng.uniform(0.01, 0.1), self._put, dc, dc.number)
        self._io(dc)

    def _restart(self, index: int) -> None:
        """The process dies (what it held in memory with it) and another starts soon."""
        dc = self.clients[index]
        if dc.router is None or self.frozen:
            return
        for addr in dc.addrs.values():
            self.sessions.pop(addr, None)
        dc.router = dc.reader = None
        self.clock.at(self.clock.now + self.rng.uniform(0.05, 1.0), self._start, dc, dc.number)

    # ------------------------------------------------------------ input, output, time

    def _io(self, dc: DurableClient) -> None:
        """Send what every session of the process has to send; wake it at its next deadline."""
        r = dc.router
        if r is None or dc.reader is None:
            return
        d = min(r.put_deadline(), dc.deadline, dc.reader.next_deadline())
        for s in r.sessions:
            addr = dc.addrs.get(id(s))
            if addr is None:
                self._ports += 1
                addr = dc.addrs[id(s)] = ("127.0.0.3", 20000 + self._ports)
                self.sessions[addr] = (dc, s)
            for dst, data in s.outgoing(self.clock.now):
                self.send(addr, dst, data)
            d = min(d, s.next_deadline())
        if d < dc.tick_at:
            dc.tick_at = d
            self.clock.at(max(d, self.clock.now), self._tick, dc, dc.number, d)

    def _tick(self, dc: DurableClient, number: int, d: float) -> None:
        r = dc.router
        if dc.number != number or dc.tick_at != d or self.frozen or r is None:
            return
        dc.tick_at = math.inf
        now = self.clock.now
        puts = r.put_deadline()
        for s in list(r.sessions):
            if now >= min(s.next_deadline(), puts):
                r.tick(s, now)
        self._acked(dc)
        self._consume(dc)
        self._io(dc)

    def arrive(self, dst: Addr, data: bytes, src: Addr) -> None:
        dc, s = self.sessions[dst]
        r = dc.router
        if r is None or self.frozen:
            return
        r.handle_datagrams(s, [(data, src)], self.clock.now)
        self._acked(dc)
        if dc.reader is not None and dc.reader.ready():
            self._consume(dc)
        self._io(dc)

    # ------------------------------------------------------------ producers

    def _put(self, dc: DurableClient, number: int) -> None:
        r = dc.router
        if dc.number != number or r is None or self.clock.now > self.fault_time + 2:
            return
        topic = self.rng.choice(DURABLE_TOPICS)
        if r.cmap is not None and not r.put_window_full(topic):
            r.put(topic, None, None, f"{dc.index}.{dc.number}:{dc.next_msg}".encode())
            dc.next_msg += 1
            self._io(dc)
        self.clock.at(self.clock.now + self.rng.uniform(*PUT_EVERY), self._put, dc, number)

    def _acked(self, dc: DurableClient) -> None:
        assert dc.router is not None
        putter = dc.router.putter
        for p, st in putter.streams.items():
            heard = dc.acked.get(p, 0)
            if st.acked > heard:
                for seq in range(heard + 1, st.acked + 1):
                    self.dcheck.put_acked(p, putter.pid, seq, self.clock.now)
                dc.acked[p] = st.acked

    def half(self) -> None:
        """The middle of the quiet period: what each producer process has put by now."""
        for dc in self.clients:
            if dc.router is not None:
                dc.marks = dc.router.putter.marks()

    def progress(self) -> None:
        """The end: a producer process that lived on has every put it made by the middle acknowledged
        (a PUTACK withheld for ever would stall it)."""
        for dc in self.clients:
            if dc.marks is None or dc.router is None:
                continue
            for p, seq in sorted(dc.marks.items()):
                acked = dc.router.putter.streams[p].acked
                if acked < seq:
                    self.check.violation(self.clock.now, f"durable client {dc.index} stalled: partition {p} "
                                                   f"acknowledged through {acked} of {seq}")  # fmt: skip

    # ------------------------------------------------------------ consumers

    def _consume(self, dc: DurableClient) -> None:
        """The consumer's turn: start its next round when due, advance the one under way (its
        reader resends, re-routes and pauses on its own), and act on the round that ended."""
        rd = dc.reader
        assert rd is not None
        now = self.clock.now
        if not rd.busy:
            if now < dc.deadline:
                return
            if dc.want == "get":
                rd.get(MOST, now)
            else:
                rd.commit(now)
            dc.deadline = math.inf
        rd.step(now)
        if rd.busy:
            return
        if dc.want == "commit":
            dc.want, dc.deadline = "get", now + self.rng.uniform(*POLL_EVERY)
            return
        new = rd.take()
        if not new:
            dc.deadline = now + self.rng.uniform(*POLL_EVERY)  # (nothing new yet: ask again)
        elif self.rng.random() < CRASH_BEFORE_COMMIT:
            self._restart(dc.index)  # (before it processed them: the next process must get them again)
        else:
            for offset, _ms, _t, _k, _tags, payload in new:
                self.dcheck.consumed(dc.index, dc.topic, dc.p, offset, payload, now)
            dc.want, dc.deadline = "commit", now
            self._consume(dc)

    # ------------------------------------------------------------ hooks on the members

    def traced(self, t: Trace) -> None:
        """A member core's durable Trace (cluster/durable.py, emitted as the simulator's configuration
        asks): what it committed and served, for the checker."""
        f, check = t.fields, self.dcheck
        if t.event == "committed":
            check.committed(f["partition"], f["records"], f["holders"], self.clock.now)
        elif t.event == "cursor_served":
            now = self.clock.now
            check.cursor_served(f["partition"], f["did"], f["key"], f["cursor"], f["member"], now)
        elif t.event == "records_served":
            index = self._readers.get(f["name"])
            if index is not None:
                check.records_served(index, f["partition"], f["records"], self.clock.now)

    def final(self) -> None:
        cores = {i: m.core for i, m in self.members.items() if m.core is not None and m.core.leave_by == math.inf}
        self.dcheck.final(self.clock.now, cores, self.logdisk.logs)
        st = self.dcheck.stats  # (scripts/simulate.py totals them)
        self.stats.update(durable_acked=st["puts_acked"], durable_consumed=st["consumed"],
                          durable_excused=st["excused"])  # fmt: skip
