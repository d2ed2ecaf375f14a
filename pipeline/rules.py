"""Judge a run from its event logs (docs/eventlog.md), Jepsen style: what was lost, duplicated
or reordered, against what each delivery mode promises (docs/guarantees.md).

Two programs apply these rules and must agree on every count: the reference checker
(pipeline/checker.py, one process; `scripts/check.py` is its command line) and the Spark audit
(pipeline/audit.py, `roost audit`). The definitions are spelled out below, and none depends on
the order the files were read in beyond the tie-break stated. What both share is here as plain
functions: the windows, the fault index and the loss and reorder classes, a fault's gap on one
path, the percentile rank.

Input
-----
Every line of ``RUN_DIR/events/*.jsonl`` (files in name order) is parsed and checked by
:func:`validate`: a JSON object with ``t`` (number), ``proc`` (string), ``ev`` (one of the
kinds of docs/eventlog.md) and every field that kind lists, each of the documented type
(``seq`` and ``subscriptions`` int, not bool; ``key`` string or null; ``deliver.member`` string
or null; ``mode`` ``reliable``/``fire``; ``phase`` ``start``/``end``; ``fault`` one of the
documented kinds; ``params`` an object when present). Extra fields are allowed. A line that
fails is *malformed*: counted and reported with file and line number, and otherwise ignored.
A second ``publish`` of one (pid, seq) is counted as ``duplicate_publishes`` and ignored (the
first wins); a second ``puback`` is ignored (the first names the acknowledging member).

Events are ordered by ``t``; ties keep file-name order, then line order.

Subscriptions and windows
-------------------------
A *subscription* is (``sub``, ``topic``, ``key``). Its *windows* come from its ``subscribe``,
``unsubscribe`` and ``cancel`` events in time order:

- ``subscribe`` opens a window at its ``t`` (the confirmation) with its ``mode``. If a window is
  open already (the client re-subscribed after a failover) that one ends there, ``end`` =
  ``resubscribe``: a re-subscription gets a new window, grace included.
- ``unsubscribe`` ends the open window (``end`` = ``unsubscribe``); ``cancel`` ends it with
  ``end`` = ``cancel`` and its ``reason``. Either without an open window is ignored.
- A window still open at the end of the run ends at the run's end (``end`` = ``run_end``): run.json
  ``ended``, or the latest event time if run.json has none.

A message (pid, seq) is the first ``publish`` of that pair, with its ``t``, ``topic``, ``key``,
``mode``, ``member`` and ``proc``. It *matches* a subscription when the topics are equal and the
subscription's key is null (whole topic: every key) or equal to the message's key.

Paths and counts
----------------
A *path* is one ``pid`` to one subscription. Its rows are split by *mode*: a (message,
subscription) pair is ``reliable`` when the message was published reliable and the subscription
window that was open at the publish (or else the last one opened before it, or else the first
one) is reliable; otherwise ``fire``. So a row is (mode, pid, sub, topic, key).

- **expected**: matching messages with ``window.open + grace < publish.t < window.close`` for a
  window of the subscription. ``grace`` (``--grace``, 0.5 s) covers the push round-trip in which
  a subscription confirmed at one member is not yet known to the others (docs/guarantees.md,
  "In a replicated cluster").
- **acknowledged**: expected reliable pairs whose message has a ``puback``.
- **delivered**: expected messages with at least one ``deliver`` on the path. A ``deliver`` is
  joined to its message by (pid, seq) and counts for *every* subscription of its ``sub`` that the
  message matches (the message's topic and key come from its ``publish``, not from the
  ``deliver``), so a keyed and a whole-topic subscription of one client are both served by the
  one delivery the broker makes.
- **missing**: expected but not delivered (any mode; in fire mode that is all there is).
- **lost**: expected, acknowledged and not delivered (reliable pairs only).
- **received**: messages with at least one ``deliver`` on the path, expected or not;
  **unexpected** = received - delivered (published before the grace ended, or between windows).
- **duplicated**: received messages with more than one ``deliver`` on the path.
- **reordered**: received messages whose first ``deliver`` on the path came after the first
  ``deliver`` of a message of the same pid with a higher seq (deliveries in time order).

A ``deliver`` whose (pid, seq) was never published is a *phantom*; one whose ``sub`` has no
subscription matching the message is *stray* (counted only).

Classification
--------------
Every lost message gets the first class that applies (X = the member in its ``puback``; a
``puback`` with a null member acknowledges all the same, and then only faults on ``all`` apply):

1. ``allowed: serving member died``: a ``fault`` ``kill`` with phase ``start`` targeting X (or
   ``all``) at a time in [publish.t, publish.t + horizon] (horizon 5 s: how long a message is in
   its member's hands at most; docs/guarantees.md: messages a member accepted and acknowledged
   but had not delivered are lost when it dies). A ``restart`` is the member coming back.
2. ``allowed: subscription ended``: the window it was expected in ended with a ``cancel`` at
   most ``horizon`` after the publish (the application was told, docs/guarantees.md "while ...
   the subscription is not cancelled").
3. ``allowed: subscriber paused or cut off past subscriber_timeout``: a ``pause`` or
   ``partition`` fault targeting X (or ``all``), from its ``start`` to its ``end`` (or to the run
   end if it never ended) lasting at least ``subscriber_timeout``, not over before the publish
   and begun by publish.t + horizon: X then drops the client's mailbox. ``subscriber_timeout`` is
   run.json ``config_text`` ``[timeouts] subscriber_timeout``, else 10 s.
4. ``allowed: subscription not yet at the member (confirmed while members were apart)``: the
   window opened while X or the subscriber's member (its ``subscribe.member``) was under a
   ``kill``, ``pause`` or ``partition`` fault, and the message was published before that fault
   ended plus ``grace`` (docs/guarantees.md: what CMDACK means).
5. ``violation``.

A duplicated message is a violation in either mode (reliable: no duplicates; fire: at most
once). A reordered message of a reliable pair (message M, first delivered after M' of the same
pid with the highest seq delivered before it) is allowed when M and M' were published through
different members, or the publisher's process had a ``failover`` (``client`` = the publish's
``proc``), or a kill/restart start hit M's or M''s publishing member, within
[min(M.publish.t, M'.publish.t), first delivery of M] (docs/cluster.md: "in order, except across
a failover of the publisher or a crash of the member it published through"), or, in a
partitioned run (run.json ``config_text``: ``[cluster] mode = "partitioned"``), a member fault
on a *mover* of the topic's partition began or ended, or a member joined or left, within
[min(M.publish.t, M'.publish.t) - horizon, first delivery of M] (docs/cluster.md does not
promise order across a change of primary; a mover is a member whose absence alone changes the
partition's primary, by client/clustermap.py's ``compute`` with ``[cluster] partitions`` and
``replicas`` over the members in the cluster when the fault began or ended: run.json's members
less those whose ``join`` had not started yet or whose ``leave`` had: :class:`Placement`);
otherwise a violation. Fire
mode promises no order, and no delivery: its reorders and misses are counted only. A phantom
is a violation. So is member disagreement (below).

Latency, faults and agreement
-----------------------------
- **latency** per mode: over the first delivery of every received message on every path,
  ``deliver.t - publish.t``; p50/p90/p99 by nearest rank (the ceil(p/100 * n)-th smallest) and
  max, in seconds.
- **faults**: ``fault`` events are paired per (fault, target): an ``end`` closes the earliest
  open ``start``; a start never ended lasts to the run end (``healed`` false); an end without a
  start is counted in ``unpaired_fault_ends``. For each fault, per path (publisher ->
  subscriber, every path with a delivery before the fault began; all deliveries together would
  hide a stalled path, since every member delivers straight to subscribers): ``gap`` is the
  longest interval without a delivery in [start, end + tail] (tail 5 s, cut at the path's last
  delivery but not before the end), with the interval's ends counting as bounds; ``recover`` is
  from the end to the path's first delivery after it (null if none); the report gives the
  maximum of each over the paths.
- **lost, classified**: a loss is allowed when the acking member was killed within ``horizon``
  (5 s) after the publish, when the subscription was cancelled within ``horizon`` after it, when
  the acking member was paused or cut off for at least ``subscriber_timeout`` starting before
  publish + ``horizon``, or when the subscription was confirmed while the acking member or the
  subscriber's member was apart (killed, paused, cut off) and the message was published before
  that ended plus ``grace`` (docs/guarantees.md: CMDACK). Anything else is a violation.
- **agreement**: the last ``status`` event per member; ``agreed`` is true when every digest is
  equal and known, false otherwise (a violation; a member that could not be asked has a null
  digest), null when there is no ``status`` event. Members listed
  in run.json without a status are reported in ``missing``. In partitioned mode a member holds
  only its partitions, and its digest is ``p:`` followed by ``partition=digest`` pairs joined
  by ``;`` (scripts/chaos.py): then every partition some member reported must have the same
  digest at every member that reported it (its owners).

Durable mode
------------
(docs/durable.md; the code is pipeline/durablerules.py, shared by the checker and the audit.)
Durable events: ``put`` (pid, seq, topic) before a put is handed to the library, ``putack``
once the put's partition acknowledged it, ``dsubscribe`` when a subscriber process starts
reading a cursor, ``record`` for every record a get returned (its ``partition`` and log
``offset``, and the payload's pid and seq), ``commit`` once the cursor is at ``offset`` on the
owners, ``crash`` just before a subscriber kills itself between a get and its commit. A message
is (pid, seq), its first ``put`` in reading order; it is *acknowledged* with a ``putack``. A
*durable subscription* here is one cursor: (``client``, ``durable``, ``topic``), known from any
of its ``dsubscribe``, ``record`` or ``commit`` events, whatever process wrote them (a restarted
subscriber is the same subscription). Its records and commits are taken in time order (ties:
reading order). Per subscription:

- **expected**: every acknowledged message put on its topic (a subscription starts at the
  earliest offset: no window, no grace);
- **records**: its ``record`` events; **received**: the messages among them (distinct pid, seq);
  **redelivered**: records of an offset it had received before (a get after a crash or a failed
  commit; de-duplication by offset drops them): records - distinct offsets;
- **duplicated**: messages received at more than one offset (the log stored them twice: the
  de-duplication by offset a consumer does keeps both); a violation;
- **lost**: expected and never received; a violation, whatever the faults, with no exemption
  (docs/durable.md: an acknowledged put survives any faults that leave a majority of the metadata
  quorum and one in-sync copy; the chaos runs fault one member at a time).
  The loss names the message's offset when another subscription read it, and the subscription
  is said to be *behind at the end* when that offset is past everything it read (a settle too
  short rather than a hole);
- **reordered**: a message whose first offset comes after the first offset of a higher seq of the
  same pid (a producer's puts to one partition are stored in order); a violation;
- **cursor regressions**: a ``commit`` whose offset is below an earlier commit's, or a ``record``
  whose offset is below the highest offset committed before it (a get after a successful commit
  starts at or after it); each event is one regression, a violation.

Over the run: an **offset conflict** is a (partition, offset) that carried two different
messages in the records of any subscriptions (a committed record replaced: a lost committed
write), each (partition, offset, other message) once, a violation; a **durable phantom** is a
(topic, message) received that was never put on that topic, a violation. ``latency`` is over
every (subscription, message) received with a put: its first record's time minus the put's.
For each fault, ``gap`` is the longest ``path_gap`` (above) over the subscriptions' record times;
``longest_gap`` is the longest interval between two consecutive records of one subscription
that began before the last put of the run.

JSON report (``check.py --json``)
---------------------------------
One object (scripts/checkschema.py holds its JSON Schema, used by the tests)::

    {"version": 1,
     "ok": bool,                       # no violation
     "run": {"dir", "seed", "started", "ended", "members": [id], "config"},
     "options": {"grace", "subscriber_timeout", "fault_tail"},
     "input": {"files": int, "events": int, "malformed": int,
               "malformed_lines": [{"file", "line", "error"}], "duplicate_publishes": int,
               "unpaired_fault_ends": int, "phantom_deliveries": int, "stray_deliveries": int,
               "by_kind": {ev: int}},
     "published": {"reliable"|"fire": {"messages": int, "acknowledged": int}},  # by publish mode
     "modes": {"reliable"|"fire": {
         "totals": {expected, acknowledged, delivered, missing, lost, received, unexpected,
                    duplicated, reordered: int},
         "lost_by_class": {class: int},
         "latency": {"n", "p50", "p90", "p99", "max"},   # seconds; null when n is 0
         "paths": [{"pid", "sub", "topic", "key", + the totals' fields}]}},
     "lost": [{"pid", "seq", "sub", "topic", "key", "member", "t", "class"}],
     "duplicated": [{"pid", "seq", "sub", "mode", "count", "members"}],
     "reordered": [{"pid", "seq", "sub", "mode", "after_seq", "class"}],
     "faults": [{"fault", "target", "start", "end", "healed", "params", "gap", "recover",
                 "deliveries"}],
     "agreement": {"agreed": bool|null, "digests": {member: digest}, "missing": [member]},
     "durable": {"puts", "acknowledged", "duplicate_puts", "crashes", "offset_conflicts", "phantoms": int,
         "totals": {expected, received, records, redelivered, duplicated, lost, reordered, commits,
                    cursor_regressions: int},
         "subscriptions": [{"client", "durable", "topic", + the totals' fields, "committed", "read_to"}],
         "latency": {"n", "p50", "p90", "p99", "max"},
         "longest_gap": {"gap", "sub", "topic", "t"},
         "faults": [{"fault", "target", "start", "end", "gap"}],     # in the order of "faults"
         "lost": [{"pid", "seq", "client", "durable", "topic", "member", "t", "offset", "read_to"}],
         "duplicated": [{"pid", "seq", "client", "durable", "topic", "offsets"}],
         "regressions": [{"client", "durable", "topic", "kind", "offset", "committed", "t", "proc"}],
         "conflicts": [{"partition", "offset", "first", "other", "t"}]},
     "violations": [{"kind", "pid", "seq", "sub", "member", "reason", "t"}]}

Times are Unix seconds; ``kind`` is ``lost``, ``duplicated``, ``reordered``, ``phantom``,
``disagreement``, or for durable mode ``durable_lost``, ``durable_duplicated``,
``durable_reordered``, ``durable_phantom``, ``offset_conflict``, ``cursor_regression`` (then
``sub`` is ``client/durable``); pid, seq and sub are null where they do not apply.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from roost.pipeline.eventlog import MODES as MODES
from roost.pipeline.eventlog import RunInfo

MEMBERSHIP_FAULTS = frozenset({"join", "leave"})

DEATH_FAULTS = frozenset({"kill"})  # (a restart is the member coming back, not dying)
MEMBER_FAULTS = frozenset({"kill", "pause", "partition"})
CUT_FAULTS = frozenset({"pause", "partition"})

DEFAULT_GRACE = 0.5
DEFAULT_SUBSCRIBER_TIMEOUT = 10.0
DEFAULT_FAULT_TAIL = 5.0
# How long a message is in its member's hands at most before it is delivered (retransmissions,
# the subscriber's failover): a fault or cancel later than this after the publish explains no loss.
DEFAULT_HORIZON = 5.0

ALLOWED_DIED = "allowed: serving member died"
ALLOWED_ENDED = "allowed: subscription ended"
ALLOWED_CUT = "allowed: subscriber paused or cut off past subscriber_timeout"
ALLOWED_UNREPLICATED = "allowed: subscription not yet at the member (confirmed while members were apart)"
VIOLATION = "violation"
LOSS_CLASSES = (ALLOWED_DIED, ALLOWED_ENDED, ALLOWED_CUT, ALLOWED_UNREPLICATED, VIOLATION)

REORDER_MEMBERS = "allowed: published through different members"
REORDER_FAILOVER = "allowed: publisher failed over"
REORDER_CRASH = "allowed: publishing member crashed"
REORDER_FIRE = "allowed: fire mode keeps no order"
REORDER_PRIMARY = "allowed: the topic's primary changed (partitioned mode)"

COUNT_FIELDS = (
    "expected",
    "acknowledged",
    "delivered",
    "missing",
    "lost",
    "received",
    "unexpected",
    "duplicated",
    "reordered",
)


@dataclass
class Window:
    """One confirmed stretch of a subscription (module docstring: windows)."""

    open: float
    mode: str
    member: str | None  # the subscriber's member at the confirmation (null: not known)
    close: float = math.inf
    end: str = "run_end"
    reason: str | None = None


@dataclass
class Subscription:
    idx: int
    sub: str
    topic: str
    key: str | None
    windows: list[Window] = field(default_factory=list)
    opens: list[float] = field(default_factory=list)
    # Filled by Checker.result: (pid, seq) -> [count, first t, first member, second member];
    # pid -> highest seq delivered so far; (mode, pid) -> counts in COUNT_FIELDS order.
    got: dict[tuple[str, int], list[Any]] = field(default_factory=dict)
    high: dict[str, int] = field(default_factory=dict)
    rows: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    def mode_window(self, t: float) -> Window:
        """The window open at `t`, else the last opened before it, else the first."""
        i = bisect_right(self.opens, t) - 1
        return self.windows[max(i, 0)]


# A message: publish (t, topic, key, mode, member, proc).
Msg = tuple[float, str, str | None, str, str, str]


# A subscription event: (t, order, ev, sub, topic, key, mode, member or reason).
SubEvent = tuple[float, int, str, str, str, str | None, str | None, str | None]


def agreement(digests: Mapping[str, str | None]) -> bool | None:
    """Whether the members' last digests agree (see "agreement" above); None: no status at all."""
    if not digests:
        return None
    values = list(digests.values())
    if None in values:
        return False  # (a member that could not be asked agrees with nobody)
    if not all(v is not None and v.startswith("p:") for v in values):
        return len(set(values)) == 1
    seen: dict[str, str] = {}
    for v in values:
        assert v is not None
        for pair in filter(None, v[2:].split(";")):
            part, _, d = pair.partition("=")
            if seen.setdefault(part, d) != d:
                return False
    return True


def build_subscriptions(subevs: Iterable[SubEvent], run_end: float) -> list[Subscription]:
    """The subscriptions and their windows (module docstring: windows), in order of first
    confirmation."""
    subs: dict[tuple[str, str, str | None], Subscription] = {}
    for t, _, ev, sub, topic, key, mode, extra in sorted(subevs):
        s = subs.get((sub, topic, key))
        if ev == "subscribe":
            if s is None:
                s = subs[(sub, topic, key)] = Subscription(len(subs), sub, topic, key)
            if s.windows and s.windows[-1].close == math.inf:
                s.windows[-1].close, s.windows[-1].end = t, "resubscribe"
            assert mode is not None
            s.windows.append(Window(open=t, mode=mode, member=extra))
            s.opens.append(t)
        elif s is not None and s.windows and s.windows[-1].close == math.inf:
            w = s.windows[-1]
            w.close, w.end, w.reason = t, ev, extra
    for s in subs.values():
        w = s.windows[-1]
        if w.close == math.inf:
            w.close = max(run_end, w.open)
    return list(subs.values())


class Placement:
    """Partitioned mode: whose faults change a topic's primary. docs/cluster.md does not promise
    one publisher's order across a change of primary (a forward in flight when two members' maps
    differ is routed again and can arrive after newer messages). The members' own function
    (client/clustermap.py ``compute``) gives each partition's primary with every member of
    run.json live, and without each one of them: a member is a *mover* of a partition when its
    absence alone changes the primary (the chaos nemesis faults one member at a time). Computed
    once, on the driver of the audit too; only plain data travels to its executors."""

    def __init__(self, members: list[str], partitions: int, replicas: int) -> None:
        self.partitions, self.replicas = partitions, replicas
        self.members = list(members)
        self._movers: dict[frozenset[str], list[frozenset[str]]] = {}
        self.movers = self.movers_among(members)

    def movers_among(self, members: Iterable[str]) -> list[frozenset[str]]:
        """Each partition's movers while exactly ``members`` are in the cluster: a run's members
        change with a join or a leave, and so do the primaries (run.json's ``members`` lists
        everyone the run ever had, a joiner and a leaver included). Cached per set."""
        from roost.client.clustermap import compute

        key = frozenset(members)
        got = self._movers.get(key)
        if got is not None:
            return got
        now = sorted(key)
        addrs = {m: (("", 0), ("", 0)) for m in now}
        full = compute(1, addrs, now, self.partitions, self.replicas).owners
        movers: list[frozenset[str]] = [frozenset() for _ in range(self.partitions)]
        for x in now:
            without = compute(1, addrs, [m for m in now if m != x], self.partitions, self.replicas).owners
            for p in range(self.partitions):
                if without[p][:1] != full[p][:1]:
                    movers[p] |= {x}
        self._movers[key] = movers
        return movers

    def partition(self, topic: str) -> int:
        from roost.client.ring import partition_of

        return partition_of(topic, self.partitions)

    def movers_of(self, topic: str) -> frozenset[str]:
        """The topic's movers with every member of the run in the cluster."""
        return self.movers[self.partition(topic)]


def placement_of(run: RunInfo) -> Placement | None:
    """The placement of a partitioned run (None in replicated mode or without members)."""
    return Placement(run.members, run.partitions, run.replicas) if run.partitioned and run.members else None


# A fault event: (t, order, fault, target, phase, params).
FaultEvent = tuple[float, int, str, str, str, dict[str, Any] | None]
# A paired fault: (start, end or None, fault, target, params).
Interval = tuple[float, float | None, str, str, dict[str, Any] | None]


class FaultIndex:
    """The faults of a run, paired into intervals and indexed for the loss and reorder rules
    (module docstring: classification)."""

    def __init__(self, faults: Iterable[FaultEvent], run_end: float, subscriber_timeout: float,
                 grace: float = DEFAULT_GRACE, horizon: float = DEFAULT_HORIZON,
                 placement: Placement | None = None) -> None:  # fmt: skip
        self.run_end, self.grace, self.horizon, self.placement = run_end, grace, horizon, placement
        self.boundaries: dict[str, list[float]] = {}  # member -> starts and ends of its member faults
        self.membership: list[float] = []  # joins and leaves (any topic's primary may change)
        # (keyed by member id; a null member, a lookup of None, finds nothing but faults on "all")
        self.deaths: dict[str | None, list[float]] = {}
        open_faults: dict[tuple[str, str], deque[tuple[float, dict[str, Any] | None]]] = {}
        intervals: list[Interval] = []
        self.unpaired_ends = 0
        for t, _, kind, target, phase, params in sorted(faults, key=lambda f: (f[0], f[1])):
            if phase == "start":
                if kind in DEATH_FAULTS:
                    self.deaths.setdefault(target, []).append(t)
                open_faults.setdefault((kind, target), deque()).append((t, params))
            else:
                q = open_faults.get((kind, target))
                if q:
                    start, p = q.popleft()
                    intervals.append((start, t, kind, target, p))
                else:
                    self.unpaired_ends += 1
        for (kind, target), q in open_faults.items():
            intervals.extend((start, None, kind, target, p) for start, p in q)
        intervals.sort(key=lambda iv: (iv[0], iv[2], iv[3]))
        self.intervals = intervals
        self.cuts: dict[str | None, list[tuple[float, float]]] = {}
        self.apart: dict[str | None, list[tuple[float, float]]] = {}  # member -> (start, stop) of its faults
        changes: list[tuple[float, str, str]] = []  # (start, join or leave, member)
        for start, end, kind, target, _ in intervals:
            if kind in MEMBER_FAULTS:
                self.boundaries.setdefault(target, []).extend((start, self.stop(start, end)))
            elif kind in MEMBERSHIP_FAULTS:
                self.membership.append(start)
                changes.append((start, kind, target))
        for times in (*self.boundaries.values(), self.membership):
            times.sort()
        # Who was in the cluster from when (primary_changed): the run's members less those that
        # joined, then each join and leave in turn (a leave from its start: it hands over then).
        self.rosters: list[tuple[float, frozenset[str]]] = []
        if placement is not None:
            now = set(placement.members) - {m for _, kind, m in changes if kind == "join"}
            self.rosters.append((-math.inf, frozenset(now)))
            for start, kind, m in sorted(changes):
                now = now | {m} if kind == "join" else now - {m}
                self.rosters.append((start, frozenset(now)))
            for _, roster in self.rosters:  # (computed here, on the audit's driver too: executors get data)
                placement.movers_among(roster)
        for start, end, kind, target, _ in intervals:
            stop = self.stop(start, end)
            if kind in CUT_FAULTS and stop - start >= subscriber_timeout:
                self.cuts.setdefault(target, []).append((start, stop))
            if kind in MEMBER_FAULTS:
                self.apart.setdefault(target, []).append((start, stop))

    def stop(self, start: float, end: float | None) -> float:
        """When a fault stopped acting: its end, or the run's end if it was never healed."""
        return end if end is not None else max(self.run_end, start)

    def died(self, member: str | None, lo: float, hi: float) -> bool:
        for target in (member, "all"):
            times = self.deaths.get(target)
            if times:
                i = bisect_left(times, lo)
                if i < len(times) and times[i] <= hi:
                    return True
        return False

    def cut_off(self, member: str | None, t: float) -> bool:
        horizon = self.horizon
        return any(
            stop >= t and start <= t + horizon
            for target in (member, "all")
            for start, stop in self.cuts.get(target, ())
        )

    def unreplicated(self, members: tuple[str | None, str | None], confirmed: float, t: float) -> bool:
        """Confirmed while the acking member or the subscriber's home was apart from the
        others, published before that ended (plus a grace): docs/guarantees.md, CMDACK."""
        grace = self.grace
        return any(
            start <= confirmed <= stop and t <= stop + grace
            for m in members
            for target in (m, "all")
            for start, stop in self.apart.get(target, ())
        )

    def classify_loss(self, ack: str | None, t: float, w: Window) -> str:
        """The class of a lost message published at `t`, acknowledged by `ack`, expected in `w`."""
        if self.died(ack, t, t + self.horizon):
            return ALLOWED_DIED
        if w.end == "cancel" and w.close <= t + self.horizon:
            return ALLOWED_ENDED
        if self.cut_off(ack, t):
            return ALLOWED_CUT
        if self.unreplicated((ack, w.member), w.open, t):
            return ALLOWED_UNREPLICATED
        return VIOLATION

    def primary_changed(self, topic: str, lo: float, hi: float) -> bool:
        """Partitioned mode: a fault on a mover of the topic's partition (or a join or leave)
        began or ended in [lo, hi]; a mover among the members in the cluster at that moment."""
        if self.placement is None:
            return False
        i = bisect_left(self.membership, lo)
        if i < len(self.membership) and self.membership[i] <= hi:
            return True
        p = self.placement.partition(topic)
        starts = [t for t, _ in self.rosters]
        for x, times in self.boundaries.items():
            for t in times[bisect_left(times, lo) :]:
                if t > hi:
                    break
                roster = self.rosters[bisect_right(starts, t) - 1][1]
                if x in self.placement.movers_among(roster)[p]:
                    return True
        return False

    def classify_reorder(self, mode: str, m: Msg, m2: Msg, first_t: float, failovers: Mapping[str, list[float]]) -> str:
        """The class of message `m` first delivered at `first_t` after `m2` (a higher seq of the
        same publisher) on a path of `mode`."""
        lo = min(m[0], m2[0])
        if mode == "fire":
            return REORDER_FIRE
        if m[4] != m2[4]:
            return REORDER_MEMBERS
        if any(lo <= x <= first_t for x in failovers.get(m[5], ())):
            return REORDER_FAILOVER
        if self.died(m[4], lo, first_t) or self.died(m2[4], lo, first_t):
            return REORDER_CRASH
        if self.primary_changed(m[1], lo - self.horizon, first_t):
            return REORDER_PRIMARY
        return VIOLATION


def path_gap(times: list[float], start: float, stop: float, tail: float) -> tuple[float, float | None, int] | None:
    """One path's (gap, recover, deliveries) around a fault from `start` to `stop` (module
    docstring: faults); `times` are the path's delivery times in order. None for a path that
    began after the fault did."""
    if not times or times[0] > start:
        return None
    hi = min(stop + tail, max(times[-1], stop))
    i, j = bisect_right(times, start), bisect_left(times, hi)
    gap, prev = 0.0, start
    for x in times[i:j]:
        if x - prev > gap:
            gap = x - prev
        prev = x
    gap = max(gap, hi - prev)
    after = bisect_right(times, stop)
    return gap, (times[after] - stop if after < len(times) else None), j - i


def rank(p: float, n: int) -> int:
    """Nearest rank: the 1-based position of the p-th percentile among n sorted values (n > 0)."""
    return max(math.ceil(p / 100 * n), 1)


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest rank: the ceil(p/100 * n)-th smallest value (n > 0)."""
    return sorted_values[rank(p, len(sorted_values)) - 1]


def latency_summary(values: list[float]) -> dict[str, Any]:
    values.sort()
    if not values:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None}
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": values[-1],
    }
