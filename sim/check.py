"""What the simulator checks: a record of the workload and the cluster's promises.

The simulator (sim/simulation.py) reports to a :class:`Checker` as things
happen: a message accepted by a member (and which reliable subscribers that
member knew of at that moment), a message handed to an application, a member
crashing, a subscriber's session ending. At the end, after the last heal, a
quiet period, and a few anti-entropy rounds with the clients frozen,
:meth:`Checker.final` compares the members' states. The
invariants (docs/cluster.md, "Deterministic simulation"; docs/guarantees.md):

* convergence: every live member holds the same subscriptions (equal
  digests and equal registers);
* subscriptions: every subscription a live client session holds as
  confirmed is present, with its mode, on every member;
* at most once: no application receives one producer's message twice;
* order: one publisher's messages reach a subscriber in publish order,
  except across a failover or restart of the publisher or a crash of the
  member it published through (then a resend, or a new process's message,
  may overtake a late original);
* no loss: a reliable message a member accepted for a subscriber it knew
  of reaches that subscriber, unless that member crashed afterwards, the
  subscription ended with a reason the application was told, or no datagram
  of the client reached any member for subscriber_timeout afterwards (the
  cluster may then give it up for gone, docs/guarantees.md). "Knew of" means
  that very subscription: a member cut off from the client's home may still
  hold one the client has ended and taken again since; what it accepted for
  the old one ends with it (the simulator compares register versions).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from roost.node import versions
from roost.node.budgets import utf8_len

# A message: (publisher index, number); numbers count from 1 per publisher.
Msg = tuple[int, int]


@dataclass
class Published:
    topic: str
    epoch: tuple[int, ...]  # the publisher's (session number, failover count, maps seen) when it published
    member: str | None = None  # the member that accepted it (first acceptance)
    crashes: int = 0  # that member's crash count then


@dataclass
class Checker:
    published: dict[Msg, Published] = field(default_factory=dict)
    # (subscriber cid, topic) -> messages owed: message -> (member, its crash count then, the
    # client's subscription object then: a later subscription to the topic is owed nothing older,
    # the time it was accepted)
    owed: dict[tuple[bytes, str], dict[Msg, tuple[str, int, object, float]]] = field(default_factory=dict)
    # subscriber cid -> (from, to): stretches of at least subscriber_timeout in which no datagram
    # of the client reached any member: the cluster may end its subscriptions then
    silences: dict[bytes, list[tuple[float, float]]] = field(default_factory=dict)
    # (subscriber index, session number, topic) -> messages delivered, in order
    delivered: dict[tuple[int, int, str], list[Msg]] = field(default_factory=dict)
    crashes: dict[str, int] = field(default_factory=dict)
    # partitioned: message -> (member that acknowledged it to its publisher, that member's
    # crash count then, when): it forwards what it does not own, and must see it delivered
    acked_at: dict[Msg, tuple[str, int, float]] = field(default_factory=dict)
    # Unix ms at which a member went out of touch for at least the tombstone horizon (sim/simulation.py,
    # _touch): a subscription register written before then may come back with it (the documented
    # limit of tombstone collection), so "dropped but still held" does not count for it
    isolated: list[int] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    unheard: set[str] = field(default_factory=set)  # joiners no other member knows (_final_partitioned)
    join_taker: dict[str, str] = field(default_factory=dict)  # joiner -> the member that took its JOIN
    left: set[str] = field(default_factory=set)  # members that left for good (the simulator's)
    checked: int = 0

    def violation(self, now: float, text: str) -> None:
        self.violations.append(f"t={now:.3f} {text}")

    def accepted(self, member: str, msg: Msg, reliable_subscribers: list[tuple[bytes, object]], now: float) -> None:
        """``member`` took ``msg`` while it knew these (client id, the client's
        subscription object) as reliable subscribers of its topic."""
        p = self.published[msg]
        if p.member is None:
            p.member, p.crashes = member, self.crashes.get(member, 0)
        for cid, st in reliable_subscribers:
            self.owed.setdefault((cid, p.topic), {}).setdefault(msg, (member, self.crashes.get(member, 0), st, now))

    def acked(self, msg: Msg, member: str, crashes: int, now: float) -> None:
        """A PUBACK from ``member``, sent when its crash count was ``crashes``, covered ``msg``."""
        self.acked_at.setdefault(msg, (member, crashes, now))

    def on_delivery(self, now: float, sub: int, session: int, topic: str, msg: Msg,
                    pub_epoch: tuple[int, ...]) -> None:  # fmt: skip
        """An application took ``msg``; ``pub_epoch`` is its publisher's (session, failovers) now."""
        self.checked += 1
        p = self.published.get(msg)
        if p is None or p.topic != topic:
            self.violation(now, f"subscriber {sub} got {msg} on {topic!r}, never published there")
            return
        got = self.delivered.setdefault((sub, session, topic), [])
        if msg in got:  # (lists are short in a simulation: a scan is fine)
            self.violation(now, f"subscriber {sub} got {msg} twice on {topic!r}")
        later = [m for m in got if m[0] == msg[0] and m[1] > msg[1]]
        if later and p.epoch == pub_epoch and self.crashes.get(p.member or "", 0) == p.crashes:
            self.violation(now, f"subscriber {sub} got {msg} after {later[-1]} (publisher order)")
        got.append(msg)

    def final(self, now: float, members: dict[str, Any], subscribers: list[Any], collecting_ms: int = 0,
              partitioned: bool = False) -> None:  # fmt: skip
        """``members``: id -> live MemberCore; ``subscribers``: (index, session number, ClientSession) or None.
        ``collecting_ms``: tombstones older than this (Unix ms) may be collected by some
        members and not yet by others (each collects on its own timer): they do not count.
        ``partitioned``: each partition's registers are compared among its owners only."""
        cores = list(members.values())
        for mid, core in members.items():
            drift = budget_drift(core.broker)
            if drift:
                self.violation(now, f"{mid}'s subscription budgets drifted from its registers: {drift}")
        in_flux = any(not versions.is_present(v) and versions.millis_of(v) < collecting_ms
                      for c in cores for cl in c.broker.clients.values() for v in cl.subs.values())  # fmt: skip
        holders: Any = lambda topic: list(members)  # noqa: E731  (who must hold a topic's registers)
        if partitioned:
            holders = self._final_partitioned(now, members, collecting_ms, in_flux)
            if holders is None:
                return
        else:
            if not in_flux and len({tuple(c.broker.digest) for c in cores}) > 1:
                self.violation(now, "members' digests differ after the last heal: " + ", ".join(
                    f"{i}={hash(tuple(c.broker.digest)) & 0xFFFF:04x}" for i, c in members.items()))  # fmt: skip
            states = {i: _registers(c, collecting_ms) for i, c in members.items()}
            if len({repr(s) for s in states.values()}) > 1:
                self.violation(now, "members' registers differ after the last heal")
        for sub in subscribers:
            if sub is None:
                continue
            index, number, session = sub
            if session.lost:
                continue
            if session.cmds.idle:
                # Nothing in flight: every member holds exactly what the client does.
                held = {tk for tk, st in session.subs.items() if st.reason is None}
                for mid, core in members.items():
                    c = core.broker.clients.get(session.cid)
                    there = {tk for tk, v in c.subs.items() if versions.is_present(v) and mid in holders(tk[0])} \
                        if c is not None else set()  # fmt: skip
                    if c is not None and self.isolated:
                        there = {tk for tk in there if versions.millis_of(c.subs[tk]) >= max(self.isolated)}
                    if there - held:
                        self.violation(now, f"subscriber {index} dropped {sorted(there - held)} "
                                            f"but {mid} still has them")  # fmt: skip
            # (no datagram of it reached any member for subscriber_timeout up to now: the members may
            # have dropped its subscriptions, docs/guarantees.md, and frozen it cannot hear so)
            given_up = any(b >= now for _, b in self.silences.get(session.cid, ()))
            for (topic, key), st in session.subs.items():
                if not st.confirmed or st.reason is not None:
                    continue
                for mid in holders(topic) if not given_up else ():
                    c = members[mid].broker.clients.get(session.cid)
                    v = c.subs.get((topic, key), 0) if c is not None else 0
                    if not versions.is_present(v) or versions.mode_of(v) != st.mode:
                        self.violation(now, f"subscriber {index}'s confirmed subscription {topic!r} "
                                            f"is missing at {mid}")  # fmt: skip
                owed = self.owed.get((session.cid, topic), {})
                got = set(self.delivered.get((index, number, topic), ()))
                gone = self.silences.get(session.cid, ())
                for msg, (mid, crashes, owed_to, at) in owed.items():
                    if any(b > at for _, b in gone):
                        continue  # the client was gone past subscriber_timeout after it was accepted
                    if msg not in got and self.crashes.get(mid, 0) == crashes and owed_to is st:
                        if _unnamed_leaver(members.get(mid), mid, session) or mid in self.unheard:
                            continue  # (docs/cluster.md, "what it does not promise": a short-lived joiner)
                        self.violation(now, f"subscriber {index} never got {msg} on {topic!r}, "
                                            f"accepted by {mid} which stayed up")  # fmt: skip
                        break
        # Partitioned: a member that acknowledged a publish and stayed up saw it taken by a
        # primary (forwarded, perhaps rerouted): none is lost between members.
        for msg, (mid, crashes, at) in self.acked_at.items():
            if self.published[msg].member is None and self.crashes.get(mid, 0) == crashes:
                self.violation(now, f"{msg} acknowledged by {mid} at t={at:.3f}, which stayed up, "
                                    "never reached a primary")  # fmt: skip

    def _final_partitioned(self, now: float, members: dict[str, Any], collecting_ms: int, in_flux: bool) -> Any:
        """Partitioned mode: every member has the same map with an owner for every
        partition, and each partition's owners hold the same registers of it.
        Returns who must hold a topic's registers, or None if the maps differ."""
        # (a member whose leave is committed owns nothing and is in no one's map: it only
        # delivers what it holds until it stops, by leave_timeout at the latest)
        maps = {i: c.cmap.owners for i, c in members.items() if c.leave_by == math.inf}
        # (docs/cluster.md, "what it does not promise": a joiner whose JOIN reached no other member
        # before the member that took it left for good is refused by the others as unknown; it
        # is left out, as long as no other member's roster knows it; seed 9046)
        unheard = {i for i in maps if self.join_taker.get(i) in self.left and self.join_taker.get(i) not in members
                   and all(i not in c.roster.known() for j, c in members.items() if j != i)}  # fmt: skip
        if len(unheard) < len(maps):
            self.unheard = unheard  # (what it accepted no subscriber can take: it is in no map they get)
            maps = {i: o for i, o in maps.items() if i not in unheard}
        if len(set(maps.values())) > 1:
            self.violation(now, "members' maps differ after the last heal: " + ", ".join(
                f"{i}={hash(o) & 0xFFFF:04x}" for i, o in maps.items()))  # fmt: skip
            return None
        owners = next(iter(maps.values()))
        if any(not o for o in owners):
            self.violation(now, "a partition has no owner after the last heal")
        own = next(iter(members.values())).own
        for p, who in enumerate(owners):
            live = [i for i in who if i in members]
            if not in_flux and len({members[i].broker.digest[p] for i in live}) > 1:
                self.violation(now, f"partition {p}: its owners' digests differ after the last heal")
            states = {i: _registers(members[i], collecting_ms, lambda t, p=p: own.partition(t) == p) for i in live}
            if len({repr(s) for s in states.values()}) > 1:
                self.violation(now, f"partition {p}: its owners' registers differ after the last heal")
        return lambda topic: list(owners[own.partition(topic)])


def budget_drift(broker: Any) -> str:
    """What a broker's budgets (node/budgets.py, node/admission.py) count that a recount of its
    registers does not: every subscription in force is charged once, to the host its record is
    charged to, and every record it admitted counts once against its host's share."""
    nbytes, tombs, hosts = 0, 0, dict[str, list[int]]()
    for c in broker.clients.values():
        live = [t for (t, _), v in c.subs.items() if versions.is_present(v)]
        if len(live) != c.live:
            return f"a record counts {c.live} subscriptions and holds {len(live)}"
        size = sum(utf8_len(t) for t in live)
        nbytes += size
        tombs += len(c.subs) - len(live)
        if (c.charged is None) != (not c.subs):
            return f"a record of {len(c.subs)} registers charged to {c.charged!r}"
        if c.charged:
            held = hosts.setdefault(c.charged, [0, 0, 0])
            held[0] += len(live)
            held[1] += size
            held[2] += len(c.subs) - len(live)
    b = broker.budgets
    if nbytes != b.filter_bytes or tombs != b.tombstones or hosts != b.hosts:
        return (
            f"filter bytes {b.filter_bytes} (recount {nbytes}), tombstones {b.tombstones} (recount {tombs}), "
            f"hosts {b.hosts} (recount {hosts})"
        )
    clients = Counter(c.counted for c in broker.clients.values() if c.counted is not None)
    if clients != Counter(broker.client_share.per_host):
        return f"client records per host {broker.client_share.per_host} (recount {dict(clients)})"
    return ""


def _unnamed_leaver(core: Any, mid: str, session: Any) -> bool:
    """``mid`` is a member whose leave is committed (it delivers what it holds until
    leave_timeout) and no map the session got ever named it: a client takes deliveries
    only from members named in a map it got, so it never accepts them. docs/cluster.md
    does not promise these (a member that leaves soon after joining; seeds 1292, 5366)."""
    if core is None or core.leave_by == math.inf:
        return False
    addr = core.roster.known().get(mid, (None, None))[0]
    return addr is not None and addr not in session.candidates


def _registers(core: Any, collecting_ms: int, keep: Any = None) -> list[Any]:
    out = []
    for cid, c in core.broker.clients.items():
        subs = sorted(((tk, v) for tk, v in c.subs.items()
                       if (versions.is_present(v) or versions.millis_of(v) >= collecting_ms)
                       and (keep is None or keep(tk[0]))), key=repr)  # fmt: skip
        if subs:
            out.append((repr(cid), c.cver, subs))
    return sorted(out)
