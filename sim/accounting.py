"""What the simulator tells its checker about messages and subscriptions (sim/simulation.py's
``Accounting`` component).

Theory of operation
-------------------
The checker (sim/check.py) judges what clients got against what members owed them, so something
must say what a member owed, as its broker core stood at the moment it owed it:

* Which reliable subscribers a member owes a message it accepted. Replicated mode: every client
  datagram a member gets goes through ``deliver``, which decodes a PUB, notes the subscribers
  the member's index matches before the core takes it, and counts them owed for the messages
  whose sequence the core's producer acknowledged. Partitioned mode: the broker core's
  ``publish`` Trace action (node/fanout.py) names them where the message is delivered from.
* When a subscription's first register was written at a member (``SimClient.starts``): a member
  holding an older register holds an earlier subscription, which is owed nothing of this one.
* A client's silences long enough for its members to give it up (``reached``).
* Which member acknowledged a publisher's messages, and at which crash count (``acked_by``).
* The epoch a publisher's order is promised within (``pub_epoch``): its process, its failovers,
  and in partitioned mode the maps installed so far (``map_changed``: a new primary may
  overtake the old one).

It holds only those counts; the clients and their addresses are the reliable workload's
(sim/workload.py), shared with it, and it hands a datagram to a member through the
simulation's ``feed``, given at construction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from roost.client import decoding, wire
from roost.client.wire import FrameType
from roost.cluster.events import Datagrams
from roost.cluster.member import MemberCore
from roost.node import versions
from roost.node.actions import Trace
from sim.check import Checker
from sim.scheduler import Scheduler
from sim.world import ClientDatagram, SimClient, SimMember, parse_payload


class Accounting:
    def __init__(self, clock: Scheduler, check: Checker, clients: list[SimClient],
                 client_at: dict[tuple[str, int], SimClient], partitioned: bool, timeout: float,
                 feed: Callable[[SimMember, Any], None]) -> None:  # fmt: skip
        self.clock = clock
        self.check = check
        self.clients = clients  # (the reliable workload's, as it changes them)
        self.client_at = client_at
        self.partitioned = partitioned
        self.timeout = timeout  # subscriber_timeout: a silence this long may be given up
        self.feed = feed  # (the simulation's: a member core takes an event, its actions performed)
        self.map_changes = 0  # partitioned: maps installed by any member (a change of primary may reorder)

    def map_changed(self) -> None:
        """A member installed a new partition map (its ``map_changed`` Log action)."""
        self.map_changes += 1

    def traced(self, m: SimMember, a: Trace) -> None:
        """A core's ``Trace`` action (node/actions.py), as the member passed it on. ``publish``
        (node/fanout.py), partitioned mode: a message is accepted where it is delivered from (its
        partition's primary, perhaps after a forward), so note what that member owes there, as
        its broker core stood when it published the message."""
        if a.event != "publish" or not self.partitioned:
            return
        f = a.fields
        topic, payload = f["topic"], f["payload"]
        if not f["owned"]:
            # (delivered where no subscription of it is indexed: to nobody; review, 2026-11-24)
            self.check.violation(self.clock.now, f"{m.id} published {parse_payload(payload)} on {topic!r}, "
                                           "a partition it does not own")  # fmt: skip
        self.check.accepted(m.id, parse_payload(payload), self._owed(topic, f["owes"]), self.clock.now)

    def deliver(self, m: SimMember, data: bytes, src: tuple[str, int]) -> None:
        """Feed a client datagram to a member; for a PUB, note which reliable
        subscribers the member owes the messages it accepts."""
        core = m.core
        assert core is not None
        if m.paused_until > self.clock.now:  # (it sees the datagram when it resumes: accounted then)
            m.backlog.append(ClientDatagram(data, src))
            return
        f = None
        if data[:1] != b"" and data[1:3] == bytes([wire.VERSION, FrameType.PUB]):
            try:
                f = decoding.decode_untrusted_frame(data)
            except wire.WireError:
                f = None
        producer = core.broker.producers.get(f[decoding.PUB_PRODUCER]) if f is not None else None
        before = producer.acked if producer is not None else 0
        owed: list[tuple[Any, list[tuple[bytes, object]]]] = []
        if f is not None and f[decoding.PUB_RELIABLE] and not self.partitioned:  # (partitioned: traced)
            for m_ in f[decoding.PUB_MESSAGES]:
                owed.append((m_, self._reliable_subscribers(core, m_[decoding.MSG_TOPIC])))
        sender = self.client_at.get(src)
        held = self._registers_of(core, sender) if sender is not None and not sender.publisher else {}
        self.feed(m, Datagrams([(data, src)]))
        if sender is not None and m.core is core and not sender.publisher:
            for tk, v in self._registers_of(core, sender).items():
                st = sender.session.subs.get(tk)
                if st is not None and versions.is_present(v) and v != held.get(tk, 0):
                    first = sender.starts.get(id(st))
                    if first is None or v < first[1]:
                        sender.starts[id(st)] = (st, v)
        if f is None or m.core is None:
            return
        producer = m.core.broker.producers.get(f[decoding.PUB_PRODUCER])
        after = producer.acked if producer is not None else 0
        for i, (msg, subs) in enumerate(owed):
            seq = f[decoding.PUB_FIRST] + i
            if before < seq <= after:
                pub, n = parse_payload(msg[decoding.MSG_PAYLOAD])
                self.check.accepted(m.id, (pub, n), subs, self.clock.now)

    def acked_by(self, c: SimClient, member: str | None, crashes: int) -> None:
        """Partitioned: the member ``c`` talks to acknowledged its publishes through
        ``c.session.acked`` (forwarded to their primaries or taken itself) when its
        crash count was ``crashes`` (the PUBACK left before any crash since)."""
        acked = c.session.acked
        seqs = c.seqs
        while seqs:  # (in publish order: stop at the first one not acknowledged)
            q = next(iter(seqs))
            if q > acked:
                break
            n = seqs.pop(q)
            if member is not None:
                self.check.acked((c.index, n), member, crashes, self.clock.now)

    def _reliable_subscribers(self, core: MemberCore, topic: str) -> list[tuple[bytes, object]]:
        """(client id, its live subscription) for every subscriber the member
        would deliver ``topic`` to reliably, at the address of its current session,
        holding that very subscription (not one the client ended since)."""
        owes = []
        for cid, mode in (core.broker.index.match(topic, None) or {}).items():
            c = core.broker.clients.get(cid)
            if mode and c is not None:
                owes.append((cid, c.addr, c.session, c.subs.get((topic, None), 0)))
        return self._owed(topic, owes)

    def _owed(self, topic: str, owes: list[tuple[bytes, Any, int, int]]) -> list[tuple[bytes, object]]:
        """Of the reliable subscribers of ``topic`` at a member (client id, address, session, the
        version of its subscription there), those the member owes a message: (client id, its
        live subscription) where the client's current session at that address holds that very
        subscription (not one the client ended since)."""
        out: list[tuple[bytes, object]] = []
        for cid, addr, session, version in owes:
            for s in self.clients:
                st = s.session.subs.get((topic, None))
                # (a member still holding the previous process's subscription, or one the
                # client ended and took again since, owes the new one nothing)
                if s.cid != cid or s.addr != addr or session != s.session.session or st is None:
                    continue
                # (and none is owed for a subscription no member has seen yet)
                start = s.starts.get(id(st))
                if st.reason is None and start is not None and version >= start[1]:
                    out.append((cid, st))
        return out

    def reached(self, c: SimClient) -> None:
        """A datagram of ``c`` reached a member: note a silence long enough to be given up."""
        if self.clock.now - c.last_reached >= self.timeout:
            self.check.silences.setdefault(c.cid, []).append((c.last_reached, self.clock.now))
        c.last_reached = self.clock.now

    @staticmethod
    def _registers_of(core: MemberCore, c: SimClient) -> dict[tuple[str, str | None], int]:
        state = core.broker.clients.get(c.cid)
        return dict(state.subs) if state is not None else {}

    def pub_epoch(self, c: SimClient) -> tuple[int, ...]:
        """What a publisher's order is promised within: its process and its failovers
        (and in partitioned mode the maps: a new primary may overtake the old one)."""
        return (c.number, c.session.failovers, self.map_changes)
