"""The reference checker: one process reads a run's event logs and judges them by the rules of
pipeline/rules.py. `scripts/check.py` is its command line; `roost audit` (pipeline/audit.py)
computes the same report with Spark and must agree with it on every count."""

from __future__ import annotations

import gc
import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from roost.pipeline import durablerules
from roost.pipeline.eventlog import InputError as InputError
from roost.pipeline.eventlog import RunInfo, event_files, load_run, read_events
from roost.pipeline.rules import (
    COUNT_FIELDS,
    DEFAULT_FAULT_TAIL,
    DEFAULT_GRACE,
    DEFAULT_HORIZON,
    DEFAULT_SUBSCRIBER_TIMEOUT,
    LOSS_CLASSES,
    MODES,
    VIOLATION,
    FaultIndex,
    Msg,
    Subscription,
    agreement,
    build_subscriptions,
    latency_summary,
    path_gap,
    placement_of,
)

_EXP, _ACK, _DEL, _MISS, _LOST, _RECV, _UNEXP, _DUP, _REORD = range(len(COUNT_FIELDS))


class Checker:
    """Collects events (add) and judges them (result). Memory is a few tuples per event."""

    def __init__(
        self,
        grace: float = DEFAULT_GRACE,
        subscriber_timeout: float | None = None,
        fault_tail: float = DEFAULT_FAULT_TAIL,
        horizon: float = DEFAULT_HORIZON,
    ) -> None:
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
        self.acks: dict[tuple[str, int], str | None] = {}  # (a null member acknowledges too)
        self.subevs: list[tuple[float, int, str, str, str, str | None, str | None, str | None]] = []
        self.delivs: list[tuple[float, int, str, str, int, str | None]] = []
        self.failovers: dict[str, list[float]] = {}
        self.faults: list[tuple[float, int, str, str, str, dict[str, Any] | None]] = []
        self.status: dict[str, tuple[float, int, str, int, str]] = {}
        self.durable = durablerules.DurableCollector()

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
        else:
            self.durable.add(ev, e, t, order)

    # -- judging ------------------------------------------------------------------------------

    def result(self, run: RunInfo) -> dict[str, Any]:
        """The JSON report (module docstring) of everything added so far."""
        run_end = run.ended if run.ended is not None else self.max_t
        sub_timeout = self.subscriber_timeout
        if sub_timeout is None:
            sub_timeout = run.subscriber_timeout if run.subscriber_timeout is not None else DEFAULT_SUBSCRIBER_TIMEOUT
        pubs, acks, grace = self.pubs, self.acks, self.grace
        subs = build_subscriptions(self.subevs, run_end)
        by_sub_topic: dict[tuple[str, str], list[Subscription]] = {}
        for s in subs:
            by_sub_topic.setdefault((s.sub, s.topic), []).append(s)

        faults = FaultIndex(self.faults, run_end, sub_timeout, grace, self.horizon, placement_of(run))

        def row(s: Subscription, mode: str, pid: str) -> list[int]:
            r = s.rows.get((mode, pid))
            if r is None:
                r = s.rows[(mode, pid)] = [0] * len(COUNT_FIELDS)
            return r

        violations: list[dict[str, Any]] = []

        def violation(
            kind: str,
            pid: str | None,
            seq: int | None,
            sub: str | None,
            member: str | None,
            reason: str,
            t: float | None,
        ) -> None:
            violations.append(
                {"kind": kind, "pid": pid, "seq": seq, "sub": sub, "member": member, "reason": reason, "t": t}
            )

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
                    duplicated.append(
                        {
                            "pid": pid,
                            "seq": seq,
                            "sub": s.sub,
                            "mode": mode,
                            "count": count,
                            "members": [first_member, second_member],
                        }
                    )
                    violation(
                        "duplicated",
                        pid,
                        seq,
                        s.sub,
                        second_member,
                        f"duplicated: delivered {count} times ({mode}; from {first_member} then {second_member})",
                        first_t,
                    )

        reordered: list[dict[str, Any]] = []
        for s, pid, seq, after in reorders:
            m, m2 = pubs[(pid, seq)], pubs[(pid, after)]
            mode = "fire" if m[3] == "fire" else s.mode_window(m[0]).mode
            row(s, mode, pid)[_REORD] += 1
            first_t = s.got[(pid, seq)][1]
            cls = faults.classify_reorder(mode, m, m2, first_t, self.failovers)
            if cls == VIOLATION:
                violation(
                    "reordered",
                    pid,
                    seq,
                    s.sub,
                    m[4],
                    f"reordered: delivered after seq {after} of the same publisher, same member, "
                    "no failover or crash between",
                    first_t,
                )
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
                    acked = mode == "reliable" and mk in acks
                    if acked:
                        r[_ACK] += 1
                    if mk in got:
                        r[_DEL] += 1
                        continue
                    r[_MISS] += 1
                    if not acked:
                        continue
                    r[_LOST] += 1
                    ack = acks_get(mk)
                    cls = faults.classify_loss(ack, pt, w)
                    if cls == VIOLATION:
                        violation(
                            "lost",
                            mk[0],
                            mk[1],
                            s.sub,
                            ack,
                            f"lost: acknowledged by {ack}, expected by {s.sub} "
                            f"({s.topic}{'' if s.key is None else '/' + s.key}), never delivered; "
                            "no fault or cancel explains it",
                            pt,
                        )
                    lost_by_class[mode][cls] += 1
                    lost.append(
                        {
                            "pid": mk[0],
                            "seq": mk[1],
                            "sub": s.sub,
                            "topic": s.topic,
                            "key": s.key,
                            "member": ack,
                            "t": pt,
                            "class": cls,
                        }
                    )

        modes_out: dict[str, Any] = {
            mode: {
                "totals": dict.fromkeys(COUNT_FIELDS, 0),
                "lost_by_class": lost_by_class[mode],
                "latency": latency_summary(latencies[mode]),
                "paths": [],
            }
            for mode in MODES
        }
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
        for start, end, kind, target, params in faults.intervals:
            stop = faults.stop(start, end)
            gap, recover, count = 0.0, None, 0
            for times in per_path.values():
                g = path_gap(times, start, stop, self.fault_tail)
                if g is None:
                    continue
                gap = max(gap, g[0])
                if g[1] is not None and (recover is None or g[1] > recover):
                    recover = g[1]
                count += g[2]
            faults_out.append(
                {
                    "fault": kind,
                    "target": target,
                    "start": start,
                    "end": end,
                    "healed": end is not None,
                    "params": params,
                    "gap": gap,
                    "recover": recover,
                    "deliveries": count,
                }
            )

        published = {mode: {"messages": 0, "acknowledged": 0} for mode in MODES}
        for mk, m in pubs.items():
            p = published[m[3]]
            p["messages"] += 1
            if mk in acks:
                p["acknowledged"] += 1

        durable, durable_violations = durablerules.judge(self.durable, faults, self.fault_tail)
        violations += durable_violations
        digests = {member: st[2] for member, st in sorted(self.status.items())}
        # (a member whose status could not be read agrees with nobody)
        agreed = agreement(digests)
        if agreed is False:
            violation(
                "disagreement",
                None,
                None,
                None,
                ",".join(digests),
                "members disagree after the last heal: "
                + ", ".join(f"{mm}={(d or 'unreachable')[:12]}" for mm, d in digests.items()),
                None,
            )
        violations.sort(key=lambda v: (v["kind"], v["pid"] or "", v["seq"] or 0, v["sub"] or ""))
        lost.sort(key=lambda x: (x["pid"], x["seq"], x["sub"]))
        duplicated.sort(key=lambda x: (x["pid"], x["seq"], x["sub"]))
        reordered.sort(key=lambda x: (x["pid"], x["seq"], x["sub"]))
        return {
            "version": 1,
            "ok": not violations,
            "run": {
                "dir": run.dir,
                "seed": run.seed,
                "started": run.started,
                "ended": run.ended,
                "members": run.members,
                "config": run.config,
            },
            "options": {"grace": grace, "subscriber_timeout": sub_timeout, "fault_tail": self.fault_tail},
            "input": {
                "files": self.files,
                "events": self.events,
                "malformed": len(self.malformed_lines),
                "malformed_lines": self.malformed_lines,
                "duplicate_publishes": self.duplicate_publishes,
                "unpaired_fault_ends": faults.unpaired_ends,
                "phantom_deliveries": phantoms,
                "stray_deliveries": stray,
                "by_kind": dict(sorted(self.by_kind.items())),
            },
            "published": published,
            "modes": modes_out,
            "lost": lost,
            "duplicated": duplicated,
            "reordered": reordered,
            "faults": faults_out,
            "agreement": {
                "agreed": agreed,
                "digests": digests,
                "missing": [mm for mm in run.members if mm not in digests],
            },
            "durable": durable,
            "violations": violations,
        }


def check_events(
    events: Iterable[Mapping[str, Any]],
    run: RunInfo,
    grace: float = DEFAULT_GRACE,
    subscriber_timeout: float | None = None,
    fault_tail: float = DEFAULT_FAULT_TAIL,
    horizon: float = DEFAULT_HORIZON,
) -> dict[str, Any]:
    """Judge already parsed events (each must pass validate()); the pure entry point."""
    checker = Checker(grace, subscriber_timeout, fault_tail, horizon)
    for e in events:
        checker.add(e)
    return checker.result(run)


def check_run(
    run_dir: str | Path,
    grace: float = DEFAULT_GRACE,
    subscriber_timeout: float | None = None,
    fault_tail: float = DEFAULT_FAULT_TAIL,
    horizon: float = DEFAULT_HORIZON,
) -> dict[str, Any]:
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
