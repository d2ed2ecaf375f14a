"""The simulator's reliable workload (sim/simulation.py's ``ReliableWorkload`` component): publishers
and subscribers over the real client session (client/session.py).

Theory of operation
-------------------
Half the clients publish, half subscribe (``SimClient.publisher``: the odd ones publish). Each is
a ``ClientSession`` driven as the client library drives it: its outgoing datagrams sent at once,
each datagram that reaches its address fed to ``handle_datagrams``, ``tick`` at its deadline.

* A publisher publishes reliably, on a topic of its own choice, every 10-80 ms while its window
  has room, up to shortly after ``fault_time``; each message is named by its payload
  (``publisher index:number``) and told to the checker with the epoch its order is promised
  within (sim/accounting.py's ``pub_epoch``). In partitioned mode the message's producer
  sequence is kept (``SimClient.seqs``) until a PUBACK covers it (``Accounting.acked_by``).
* A subscriber takes two topics reliably and, every 1-4 s until ``fault_time``, drops one or
  takes up another (tombstones and re-subscriptions for the members to agree on); every
  message its session delivers is told to the checker.
* ``restart``, the nemesis's client restart: the process dies and starts again with the same
  client id, a new session and a new address; sometimes late, past ``subscriber_timeout``.
* At the end (``freeze``) the clients neither send nor receive and their timers stop, while the
  members settle (sim/simulation.py's ``run``).

Every draw comes from the run's main random source, in the order the simulation always made
them (a seed must run as it did). The workload holds the clients and their addresses (shared
with sim/accounting.py, which reads them); it sends through the simulation's ``send`` and reads
the members' addresses, given at construction.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from roost.client.session import ClientConfig, ClientSession
from roost.client.wire import Mode
from roost.cluster.config import ClusterConfig
from sim.accounting import Accounting
from sim.check import Checker, Published
from sim.scheduler import Scheduler
from sim.world import WALL, SimClient, SimMember, parse_payload

Addr = tuple[str, int]


class ReliableWorkload:
    def __init__(self, clock: Scheduler, rng: random.Random, count: int, topics: tuple[str, ...],
                 clients: list[SimClient], client_at: dict[Addr, SimClient], members: dict[str, SimMember],
                 cc: ClusterConfig, fault_time: float, partitioned: bool, check: Checker, accounting: Accounting,
                 stats: dict[str, int], send: Callable[[Addr, Addr, bytes], None]) -> None:  # fmt: skip
        """Make ``count`` clients (into ``clients`` and ``client_at``); ``begin`` starts them."""
        self.clock = clock
        self.rng = rng  # (the run's main source)
        self.topics = topics
        self.clients = clients
        self.client_at = client_at
        self.members = members  # (the simulation's: a new session may name any of them, joiners too)
        self.cc = cc
        self.fault_time = fault_time
        self.partitioned = partitioned
        self.check = check
        self.accounting = accounting
        self.stats = stats
        self.send = send  # (the simulation's network)
        self.frozen = False  # after the end: clients neither send nor receive (``freeze``)
        ids = list(self.members)
        for i in range(count):
            cid = self.rng.randbytes(16)
            c = SimClient(i, cid, ("127.0.0.2", 9001 + i), self._new_session(cid, ids, 1))
            c.publisher = i % 2 == 1
            c.topics = self.rng.sample(self.topics, 2) if not c.publisher else list(self.topics)
            self.clients.append(c)
            self.client_at[c.addr] = c

    def begin(self) -> None:
        """Each client's process starts at a random time in its first second and a half."""
        for c in self.clients:
            self.clock.at(self.rng.uniform(0.5, 1.5), self._begin, c, c.number)

    def freeze(self) -> None:
        """The end: the clients neither send nor receive, and their timers stop."""
        self.frozen = True

    def arrive(self, c: SimClient, data: bytes, src: Addr, member: str | None, crashes: int) -> None:
        """A datagram from ``src`` (``member``, or None; when it sent it, it had crashed ``crashes``
        times) reached ``c``'s address."""
        now = self.clock.now
        c.session.handle_datagrams([(data, src)], now)
        if c.seqs:
            self.accounting.acked_by(c, member, crashes)
        self._io(c)

    def _new_session(self, cid: bytes, ids: list[str], number: int) -> ClientSession:
        order = list(ids)
        self.rng.shuffle(order)
        addrs = [self.members[i].addr for i in order]
        cfg = ClientConfig(pub_window=256, max_buffered=100_000, breaks=self.cc.breaks)
        now = self.clock.now
        return ClientSession(cid, self.rng.randbytes(16), self.rng.randbytes(16), cfg, now, node=addrs[0],
                             members=addrs[1:], session=int((WALL + now) * 1000) + number)  # fmt: skip

    def _begin(self, c: SimClient, number: int) -> None:
        if c.number != number:
            return
        if c.publisher:
            self.clock.at(self.clock.now + self.rng.uniform(0.01, 0.1), self._publish, c, number)
        else:
            for t in c.topics:
                c.session.subscribe(t, None, Mode.RELIABLE)
            self.clock.at(self.clock.now + self.rng.uniform(1.0, 4.0), self._churn, c, number)
        self._io(c)

    def _churn(self, c: SimClient, number: int) -> None:
        """A subscriber drops one of its topics or takes up another (tombstones
        and re-subscriptions for the replicas to agree on)."""
        if c.number != number or self.clock.now > self.fault_time or c.session.lost:
            return
        topic = self.rng.choice(self.topics)
        if (topic, None) in c.session.subs:
            c.session.unsubscribe(topic, None)
        else:
            c.session.subscribe(topic, None, Mode.RELIABLE)
        self._io(c)
        self.clock.at(self.clock.now + self.rng.uniform(1.0, 4.0), self._churn, c, number)

    def _publish(self, c: SimClient, number: int) -> None:
        if c.number != number or self.clock.now > self.fault_time + 2:
            return
        s = c.session
        if s.lost:
            return
        if not s.window_full:
            topic = self.rng.choice(c.topics)
            n = c.next_msg
            c.next_msg += 1
            self.check.published[(c.index, n)] = Published(topic, self.accounting.pub_epoch(c))
            s.publish(topic, None, None, f"{c.index}:{n}".encode(), True)
            if self.partitioned:
                c.seqs[s.last_seq] = n
            self._io(c)
        self.clock.at(self.clock.now + self.rng.uniform(0.01, 0.08), self._publish, c, number)

    def _io(self, c: SimClient) -> None:
        """Hand the checker what the session delivered, send what it has to send, and wake it at
        its next deadline."""
        s = c.session
        now = self.clock.now
        for st_key, st in s.subs.items():
            while st.queue:
                payload = st.take().payload
                s.consumed(st)
                pub, n = parse_payload(payload)
                p = self.clients[pub]
                self.check.on_delivery(now, c.index, c.number, st_key[0], (pub, n), self.accounting.pub_epoch(p))
        for dst, data in s.outgoing(now):
            self.send(c.addr, dst, data)
        d = s.next_deadline()
        if d < c.tick_at:
            c.tick_at = d
            self.clock.at(max(d, self.clock.now), self._tick, c, c.number, d)

    def _tick(self, c: SimClient, number: int, d: float) -> None:
        if c.number != number or c.tick_at != d or self.frozen:
            return
        c.tick_at = math.inf
        c.session.tick(self.clock.now)
        self._io(c)

    def restart(self, index: int) -> None:
        """The client process dies and starts again: same client id, new
        session, new address; what the old session held is gone."""
        c = self.clients[index]
        del self.client_at[c.addr]
        c.number += 1
        c.addr = ("127.0.0.2", 9001 + index + 100 * c.number)
        self.client_at[c.addr] = c
        c.session = self._new_session(c.cid, list(self.members), c.number)
        c.seqs.clear()  # (what the old process never had acknowledged is not promised)
        c.tick_at = math.inf
        self.stats["client_restarts"] += 1
        # (sometimes the new process comes late: past subscriber_timeout, the members time the old one out)
        late = self.rng.random() < 0.3
        self.clock.at(self.clock.now + (self.rng.uniform(5.5, 9.0) if late else self.rng.uniform(0.1, 1.0)),
                      self._begin, c, c.number)  # fmt: skip
