"""Judge a run from its event logs (docs/eventlog.md), Jepsen style: what was lost, duplicated
or reordered, against what each delivery mode promises (docs/guarantees.md).

`scripts/check.py` is the command line around this module. The logic lives here, as plain
functions over parsed events, because the Spark audit of a later issue must reproduce exactly
the same counts on the same logs: every definition it needs is spelled out below, and none
depends on the order the files were read in beyond the tie-break stated.

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
Every lost message gets the first class that applies (X = the member in its ``puback``):

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
a failover of the publisher or a crash of the member it published through"); otherwise a
violation. Fire mode promises no order, and no delivery: its reorders and misses are counted
only. A phantom is a violation. So is member disagreement (below).

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
  in run.json without a status are reported in ``missing``.

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
     "violations": [{"kind", "pid", "seq", "sub", "member", "reason", "t"}]}

Times are Unix seconds; ``kind`` is ``lost``, ``duplicated``, ``reordered``, ``phantom`` or
``disagreement`` (pid, seq and sub null where they do not apply).
"""

from __future__ import annotations

import gc
import math
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.checkinput import FAULT_KINDS as FAULT_KINDS
from scripts.checkinput import MODES as MODES
from scripts.checkinput import InputError as InputError
from scripts.checkinput import RunInfo as RunInfo
from scripts.checkinput import event_files as event_files
from scripts.checkinput import load_run as load_run
from scripts.checkinput import read_events as read_events
from scripts.checkinput import validate as validate

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

COUNT_FIELDS = (
    "expected", "acknowledged", "delivered", "missing", "lost", "received", "unexpected", "duplicated", "reordered",
)
_EXP, _ACK, _DEL, _MISS, _LOST, _RECV, _UNEXP, _DUP, _REORD = range(len(COUNT_FIELDS))

@dataclass
class Window:
    """One confirmed stretch of a subscription (module docstring: windows)."""

    open: float
    mode: str
    member: str
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


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest rank: the ceil(p/100 * n)-th smallest value (n > 0)."""
    n = len(sorted_values)
    return sorted_values[max(math.ceil(p / 100 * n), 1) - 1]


def latency_summary(values: list[float]) -> dict[str, Any]:
    values.sort()
    if not values:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None}
    return {"n": len(values), "p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99), "max": values[-1]}


class Checker:
    """Collects events (add) and judges them (result). Memory is a few tuples per event."""

    def __init__(self, grace: float = DEFAULT_GRACE, subscriber_timeout: float | None = None,
                 fault_tail: float = DEFAULT_FAULT_TAIL, horizon: float = DEFAULT_HORIZON) -> None:
        self.grace = grace
        self.horizon = horizon
        self.subscriber_timeout = subscriber_timeout
        self.fault_tail = fault_tail
        self.files = 0
        self.events = 0
        self.by_kind: dict[str, int] = {}
        self.malformed_lines: list[dict[str, Any]] = []
        self.duplicate_publishes = 0
        self.max_t = -math.inf
        self.pubs: dict[tuple[str, int], Msg] = {}
        self.acks: dict[tuple[str, int], str] = {}
        self.subevs: list[tuple[float, int, str, str, str, str | None, str | None, str | None]] = []
        self.delivs: list[tuple[float, int, str, str, int, str | None]] = []
        self.failovers: dict[str, list[float]] = {}
        self.faults: list[tuple[float, int, str, str, str, dict[str, Any] | None]] = []
        self.status: dict[str, tuple[float, int, str, int, str]] = {}

    def malformed(self, file: str, line: int, error: str) -> None:
        self.malformed_lines.append({"file": file, "line": line, "error": error[:200]})

    def add(self, e: Mapping[str, Any]) -> None:
        """One valid event (validate() said None)."""
        order = self.events
        self.events = order + 1
        t = float(e["t"])
        if t > self.max_t:
            self.max_t = t
        ev = e["ev"]
        self.by_kind[ev] = self.by_kind.get(ev, 0) + 1
        if ev == "deliver":
            self.delivs.append((t, order, e["sub"], e["pid"], e["seq"], e["member"]))
        elif ev == "publish":
            k = (e["pid"], e["seq"])
            if k in self.pubs:
                self.duplicate_publishes += 1
            else:
                self.pubs[k] = (t, e["topic"], e["key"], e["mode"], e["member"], e["proc"])
        elif ev == "puback":
            self.acks.setdefault((e["pid"], e["seq"]), e["member"])
        elif ev == "subscribe":
            self.subevs.append((t, order, ev, e["sub"], e["topic"], e["key"], e["mode"], e["member"]))
        elif ev == "unsubscribe":
            self.subevs.append((t, order, ev, e["sub"], e["topic"], e["key"], None, None))
        elif ev == "cancel":
            self.subevs.append((t, order, ev, e["sub"], e["topic"], e["key"], None, e["reason"]))
        elif ev == "failover":
            self.failovers.setdefault(e["client"], []).append(t)
        elif ev == "fault":
            self.faults.append((t, order, e["fault"], e["target"], e["phase"], e.get("params")))
        elif ev == "status":
            prev = self.status.get(e["member"])
            if prev is None or (t, order) >= prev[:2]:
                self.status[e["member"]] = (t, order, e["digest"], e["subscriptions"], e["state"])

    # -- judging ------------------------------------------------------------------------------

    def _subscriptions(self, run_end: float) -> list[Subscription]:
        subs: dict[tuple[str, str, str | None], Subscription] = {}
        for t, _, ev, sub, topic, key, mode, extra in sorted(self.subevs):
            s = subs.get((sub, topic, key))
            if ev == "subscribe":
                if s is None:
                    s = subs[(sub, topic, key)] = Subscription(len(subs), sub, topic, key)
                if s.windows and s.windows[-1].close == math.inf:
                    s.windows[-1].close, s.windows[-1].end = t, "resubscribe"
                assert mode is not None and extra is not None
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

    def result(self, run: RunInfo) -> dict[str, Any]:
        """The JSON report (module docstring) of everything added so far."""
        run_end = run.ended if run.ended is not None else self.max_t
        sub_timeout = self.subscriber_timeout
        if sub_timeout is None:
            sub_timeout = run.subscriber_timeout if run.subscriber_timeout is not None else DEFAULT_SUBSCRIBER_TIMEOUT
        pubs, acks, grace = self.pubs, self.acks, self.grace
        subs = self._subscriptions(run_end)
        by_sub_topic: dict[tuple[str, str], list[Subscription]] = {}
        for s in subs:
            by_sub_topic.setdefault((s.sub, s.topic), []).append(s)

        # Faults: deaths per target, long cuts per target, paired intervals.
        deaths: dict[str, list[float]] = {}
        open_faults: dict[tuple[str, str], deque[tuple[float, dict[str, Any] | None]]] = {}
        intervals: list[tuple[float, float | None, str, str, dict[str, Any] | None]] = []
        unpaired_ends = 0
        for t, _, kind, target, phase, params in sorted(self.faults, key=lambda f: (f[0], f[1])):
            if phase == "start":
                if kind in DEATH_FAULTS:
                    deaths.setdefault(target, []).append(t)
                open_faults.setdefault((kind, target), deque()).append((t, params))
            else:
                q = open_faults.get((kind, target))
                if q:
                    start, p = q.popleft()
                    intervals.append((start, t, kind, target, p))
                else:
                    unpaired_ends += 1
        for (kind, target), q in open_faults.items():
            intervals.extend((start, None, kind, target, p) for start, p in q)
        intervals.sort(key=lambda iv: (iv[0], iv[2], iv[3]))
        cuts: dict[str, list[tuple[float, float]]] = {}
        apart: dict[str, list[tuple[float, float]]] = {}  # member -> (start, stop) of its faults
        for start, end, kind, target, _ in intervals:
            stop = end if end is not None else max(run_end, start)
            if kind in CUT_FAULTS and stop - start >= sub_timeout:
                cuts.setdefault(target, []).append((start, stop))
            if kind in MEMBER_FAULTS:
                apart.setdefault(target, []).append((start, stop))
        horizon = self.horizon

        def died(member: str, lo: float, hi: float) -> bool:
            for target in (member, "all"):
                times = deaths.get(target)
                if times:
                    i = bisect_left(times, lo)
                    if i < len(times) and times[i] <= hi:
                        return True
            return False

        def cut_off(member: str, t: float) -> bool:
            return any(stop >= t and start <= t + horizon
                       for target in (member, "all") for start, stop in cuts.get(target, ()))

        def unreplicated(members: tuple[str, str], confirmed: float, t: float) -> bool:
            """Confirmed while the acking member or the subscriber's home was apart from the
            others, published before that ended (plus a grace): docs/guarantees.md, CMDACK."""
            return any(start <= confirmed <= stop and t <= stop + grace
                       for m in members for target in (m, "all") for start, stop in apart.get(target, ()))

        def row(s: Subscription, mode: str, pid: str) -> list[int]:
            r = s.rows.get((mode, pid))
            if r is None:
                r = s.rows[(mode, pid)] = [0] * len(COUNT_FIELDS)
            return r

        violations: list[dict[str, Any]] = []

        def violation(kind: str, pid: str | None, seq: int | None, sub: str | None, member: str | None,
                      reason: str, t: float | None) -> None:
            violations.append({"kind": kind, "pid": pid, "seq": seq, "sub": sub, "member": member,
                               "reason": reason, "t": t})

        # Deliveries, in time order: first delivery, count and high-water seq per path. The loops
        # below run once per event or per expected message, hence the local names.
        self.delivs.sort()
        reorders: list[tuple[Subscription, str, int, int]] = []
        stray = phantoms = 0
        pubs_get, candidates = pubs.get, by_sub_topic.get
        for t, _, sub, pid, seq, member in self.delivs:
            mk = (pid, seq)
            m = pubs_get(mk)
            if m is None:
                phantoms += 1
                violation("phantom", pid, seq, sub, member, "delivered but never published", t)
                continue
            matched = False
            for s in candidates((sub, m[1]), ()):
                if s.key is not None and s.key != m[2]:
                    continue
                matched = True
                rec = s.got.get(mk)
                if rec is None:
                    s.got[mk] = [1, t, member, None]
                    hw = s.high.get(pid)
                    if hw is None or seq > hw:
                        s.high[pid] = seq
                    else:
                        reorders.append((s, pid, seq, hw))
                else:
                    rec[0] += 1
                    if rec[0] == 2:
                        rec[3] = member
            if not matched:
                stray += 1

        latencies: dict[str, list[float]] = {mode: [] for mode in MODES}
        duplicated: list[dict[str, Any]] = []
        for s in subs:
            only = s.windows[0].mode if len(s.windows) == 1 else None
            for mk, (count, first_t, first_member, second_member) in s.got.items():
                m = pubs[mk]
                mode = "fire" if m[3] == "fire" else (only or s.mode_window(m[0]).mode)
                r = row(s, mode, mk[0])
                r[_RECV] += 1
                latencies[mode].append(first_t - m[0])
                if count > 1:
                    r[_DUP] += 1
                    pid, seq = mk
                    duplicated.append({"pid": pid, "seq": seq, "sub": s.sub, "mode": mode, "count": count,
                                       "members": [first_member, second_member]})
                    violation("duplicated", pid, seq, s.sub, second_member,
                              f"duplicated: delivered {count} times ({mode}; from {first_member} then "
                              f"{second_member})", first_t)

        reordered: list[dict[str, Any]] = []
        for s, pid, seq, after in reorders:
            m, m2 = pubs[(pid, seq)], pubs[(pid, after)]
            mode = "fire" if m[3] == "fire" else s.mode_window(m[0]).mode
            row(s, mode, pid)[_REORD] += 1
            first_t = s.got[(pid, seq)][1]
            lo = min(m[0], m2[0])
            if mode == "fire":
                cls = REORDER_FIRE
            elif m[4] != m2[4]:
                cls = REORDER_MEMBERS
            elif any(lo <= x <= first_t for x in self.failovers.get(m[5], ())):
                cls = REORDER_FAILOVER
            elif died(m[4], lo, first_t) or died(m2[4], lo, first_t):
                cls = REORDER_CRASH
            else:
                cls = VIOLATION
                violation("reordered", pid, seq, s.sub, m[4],
                          f"reordered: delivered after seq {after} of the same publisher, same member, "
                          "no failover or crash between", first_t)
            reordered.append({"pid": pid, "seq": seq, "sub": s.sub, "mode": mode, "after_seq": after, "class": cls})

        # Expectations, window by window over the publishes sorted by time.
        Item = tuple[float, tuple[str, int], Msg]
        by_topic: dict[str, list[Item]] = {}
        by_topic_key: dict[tuple[str, str | None], list[Item]] = {}
        for mk, m in pubs.items():
            item = (m[0], mk, m)
            by_topic.setdefault(m[1], []).append(item)
            by_topic_key.setdefault((m[1], m[2]), []).append(item)
        times_of: dict[int, list[float]] = {}
        for lst in (*by_topic.values(), *by_topic_key.values()):
            lst.sort()  # by time, then (pid, seq), which is unique: the Msg is never compared
            times_of[id(lst)] = [x[0] for x in lst]
        lost: list[dict[str, Any]] = []
        lost_by_class: dict[str, dict[str, int]] = {mode: dict.fromkeys(LOSS_CLASSES, 0) for mode in MODES}
        acks_get = acks.get
        for s in subs:
            found = by_topic.get(s.topic) if s.key is None else by_topic_key.get((s.topic, s.key))
            if not found:
                continue
            times = times_of[id(found)]
            got, rows = s.got, s.rows
            for w in s.windows:
                lo_i = bisect_right(times, w.open + grace)
                hi_i = bisect_left(times, w.close)
                wfire = w.mode == "fire"
                for pt, mk, m in found[lo_i:hi_i]:
                    mode = "fire" if wfire or m[3] == "fire" else "reliable"
                    r = rows.get((mode, mk[0])) or row(s, mode, mk[0])
                    r[_EXP] += 1
                    ack = acks_get(mk) if mode == "reliable" else None
                    if ack is not None:
                        r[_ACK] += 1
                    if mk in got:
                        r[_DEL] += 1
                        continue
                    r[_MISS] += 1
                    if ack is None:
                        continue
                    r[_LOST] += 1
                    if died(ack, pt, pt + horizon):
                        cls = ALLOWED_DIED
                    elif w.end == "cancel" and w.close <= pt + horizon:
                        cls = ALLOWED_ENDED
                    elif cut_off(ack, pt):
                        cls = ALLOWED_CUT
                    elif unreplicated((ack, w.member), w.open, pt):
                        cls = ALLOWED_UNREPLICATED
                    else:
                        cls = VIOLATION
                        violation("lost", mk[0], mk[1], s.sub, ack,
                                  f"lost: acknowledged by {ack}, expected by {s.sub} "
                                  f"({s.topic}{'' if s.key is None else '/' + s.key}), never delivered; "
                                  "no fault or cancel explains it", pt)
                    lost_by_class[mode][cls] += 1
                    lost.append({"pid": mk[0], "seq": mk[1], "sub": s.sub, "topic": s.topic, "key": s.key,
                                 "member": ack, "t": pt, "class": cls})

        modes_out: dict[str, Any] = {
            mode: {"totals": dict.fromkeys(COUNT_FIELDS, 0), "lost_by_class": lost_by_class[mode],
                   "latency": latency_summary(latencies[mode]), "paths": []}
            for mode in MODES}
        for s in subs:
            for (mode, pid), r in s.rows.items():
                r[_UNEXP] = r[_RECV] - r[_DEL]
                counts = dict(zip(COUNT_FIELDS, r, strict=True))
                modes_out[mode]["paths"].append({"pid": pid, "sub": s.sub, "topic": s.topic, "key": s.key, **counts})
                totals = modes_out[mode]["totals"]
                for f in COUNT_FIELDS:
                    totals[f] += counts[f]
        for mode in MODES:
            modes_out[mode]["paths"].sort(key=lambda p: (p["pid"], p["sub"], p["topic"], p["key"] or ""))

        # Delivery gap and recovery around each fault, per path (publisher -> subscriber): any
        # member delivers straight to subscribers, so all deliveries together hide a stalled path.
        per_path: dict[tuple[str, str], list[float]] = {}
        for d in self.delivs:
            per_path.setdefault((d[2], d[3]), []).append(d[0])
        faults_out = []
        for start, end, kind, target, params in intervals:
            stop = end if end is not None else max(run_end, start)
            gap, recover, count = 0.0, None, 0
            for times in per_path.values():
                if times[0] > start:
                    continue  # (a path that began after the fault did)
                hi = min(stop + self.fault_tail, max(times[-1], stop))
                i, j = bisect_right(times, start), bisect_left(times, hi)
                count += j - i
                prev = start
                for x in times[i:j]:
                    if x - prev > gap:
                        gap = x - prev
                    prev = x
                gap = max(gap, hi - prev)
                after = bisect_right(times, stop)
                if after < len(times):
                    r = times[after] - stop
                    recover = r if recover is None or r > recover else recover
            faults_out.append({"fault": kind, "target": target, "start": start, "end": end, "healed": end is not None,
                               "params": params, "gap": gap, "recover": recover,
                               "deliveries": count})

        digests = {member: st[2] for member, st in sorted(self.status.items())}
        # (a member whose status could not be read agrees with nobody)
        agreed = None if not digests else len(set(digests.values())) == 1 and None not in digests.values()
        if agreed is False:
            violation("disagreement", None, None, None, ",".join(digests),
                      "members disagree after the last heal: "
                      + ", ".join(f"{mm}={(d or 'unreachable')[:12]}" for mm, d in digests.items()), None)
        violations.sort(key=lambda v: (v["kind"], v["pid"] or "", v["seq"] or 0, v["sub"] or ""))
        lost.sort(key=lambda x: (x["pid"], x["seq"], x["sub"]))
        duplicated.sort(key=lambda x: (x["pid"], x["seq"], x["sub"]))
        reordered.sort(key=lambda x: (x["pid"], x["seq"], x["sub"]))
        return {
            "version": 1,
            "ok": not violations,
            "run": {"dir": run.dir, "seed": run.seed, "started": run.started, "ended": run.ended,
                    "members": run.members, "config": run.config},
            "options": {"grace": grace, "subscriber_timeout": sub_timeout, "fault_tail": self.fault_tail},
            "input": {"files": self.files, "events": self.events, "malformed": len(self.malformed_lines),
                      "malformed_lines": self.malformed_lines, "duplicate_publishes": self.duplicate_publishes,
                      "unpaired_fault_ends": unpaired_ends, "phantom_deliveries": phantoms,
                      "stray_deliveries": stray, "by_kind": dict(sorted(self.by_kind.items()))},
            "modes": modes_out,
            "lost": lost,
            "duplicated": duplicated,
            "reordered": reordered,
            "faults": faults_out,
            "agreement": {"agreed": agreed, "digests": digests,
                          "missing": [mm for mm in run.members if mm not in digests]},
            "violations": violations,
        }


def check_events(events: Iterable[Mapping[str, Any]], run: RunInfo, grace: float = DEFAULT_GRACE,
                 subscriber_timeout: float | None = None, fault_tail: float = DEFAULT_FAULT_TAIL,
                 horizon: float = DEFAULT_HORIZON) -> dict[str, Any]:
    """Judge already parsed events (each must pass validate()); the pure entry point."""
    checker = Checker(grace, subscriber_timeout, fault_tail, horizon)
    for e in events:
        checker.add(e)
    return checker.result(run)


def check_run(run_dir: str | Path, grace: float = DEFAULT_GRACE, subscriber_timeout: float | None = None,
              fault_tail: float = DEFAULT_FAULT_TAIL, horizon: float = DEFAULT_HORIZON) -> dict[str, Any]:
    """Judge a run directory; InputError when there is no run.json or no event at all."""
    run = load_run(run_dir)
    paths = event_files(run_dir)
    if not paths:
        raise InputError(f"{Path(run_dir) / 'events'}: no *.jsonl event files")
    checker = Checker(grace, subscriber_timeout, fault_tail, horizon)
    # Millions of long-lived tuples and no cycles: the cyclic collector would only rescan them.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        read_events(paths, checker)
        if checker.events == 0:
            raise InputError(f"{Path(run_dir) / 'events'}: no valid event in {len(paths)} file(s)")
        return checker.result(run)
    finally:
        if was_enabled:
            gc.enable()
