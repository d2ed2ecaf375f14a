"""Durable mode's rules: the durable section of the report, judged from the durable events of a
run (docs/eventlog.md). The definitions are spelled out in pipeline/rules.py's docstring ("Durable
mode"); this is their code, shared by the reference checker (pipeline/checker.py) and the Spark
audit (pipeline/analysis.py collects the durable events to the driver and runs the same code).

A :class:`DurableCollector` takes the events in any order (each with its time and reading order:
"first" means first in reading order, as for publishes) and :func:`judge` returns the section and
the violations. Memory: a few tuples per durable event.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from roost.pipeline.rules import FaultIndex, latency_summary, path_gap

DURABLE_KINDS = frozenset({"put", "putack", "dsubscribe", "record", "commit", "crash"})
DURABLE_VIOLATIONS = ("durable_lost", "durable_duplicated", "durable_reordered", "durable_phantom", "offset_conflict",
                      "cursor_regression")  # fmt: skip
DURABLE_COUNTS = ("expected", "received", "records", "redelivered", "duplicated", "lost", "reordered", "commits",
                  "cursor_regressions")  # fmt: skip

SubKey = tuple[str, str, str]  # a durable subscription's cursor on one topic: (client, durable name, topic)
MsgKey = tuple[str, int]  # (pid, seq)
# A record event: (t, order, client, durable, topic, partition, offset, pid, seq, member, proc)
RecordEv = tuple[float, int, str, str, str, int, int, str, int, str | None, str]
# A commit event: (t, order, client, durable, topic, offset, proc)
CommitEv = tuple[float, int, str, str, str, int, str]


def sub_name(k: SubKey) -> str:
    return f"{k[0]}/{k[1]}"


class DurableCollector:
    """The durable events of one run (``add`` each valid one; other kinds are ignored)."""

    def __init__(self) -> None:
        self.events = 0
        self.puts: dict[MsgKey, tuple[int, float, str, str | None, str]] = {}  # (order, t, topic, member, proc)
        self.put_events = 0
        self.acks: dict[MsgKey, tuple[int, float, int, str | None]] = {}  # (order, t, partition, member)
        self.opens: dict[SubKey, float] = {}  # first dsubscribe
        self.records: list[RecordEv] = []
        self.commits: list[CommitEv] = []
        self.crashes = 0

    def add(self, ev: str, e: Mapping[str, Any], t: float, order: int) -> None:
        if ev not in DURABLE_KINDS:
            return
        self.events += 1
        if ev == "record":
            self.records.append((t, order, e["client"], e["durable"], e["topic"], e["partition"], e["offset"],
                                 e["pid"], e["seq"], e["member"], e["proc"]))  # fmt: skip
        elif ev == "put":
            self.put_events += 1
            k = (e["pid"], e["seq"])
            old = self.puts.get(k)
            if old is None or order < old[0]:
                self.puts[k] = (order, t, e["topic"], e["member"], e["proc"])
        elif ev == "putack":
            k = (e["pid"], e["seq"])
            old_ack = self.acks.get(k)
            if old_ack is None or order < old_ack[0]:
                self.acks[k] = (order, t, e["partition"], e["member"])
        elif ev == "commit":
            self.commits.append((t, order, e["client"], e["durable"], e["topic"], e["offset"], e["proc"]))
        elif ev == "dsubscribe":
            k3 = (e["client"], e["durable"], e["topic"])
            self.opens[k3] = min(self.opens.get(k3, math.inf), t)
        else:
            self.crashes += 1


class _Sub:
    """What one durable subscription (on one topic) received and committed."""

    def __init__(self) -> None:
        self.at: dict[int, list[Any]] = {}  # offset -> [receipts, (pid, seq), first t]
        self.offsets_of: dict[MsgKey, list[int]] = {}  # message -> distinct offsets, in order of receipt
        self.times: list[float] = []  # every record event's time, in order
        self.counts = dict.fromkeys(DURABLE_COUNTS, 0)
        self.committed: int | None = None  # the highest offset committed


def judge(c: DurableCollector, faults: FaultIndex, fault_tail: float,
          limit: int | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:  # fmt: skip
    """The durable section of the report and its violations (pipeline/rules.py, "Durable mode").
    ``limit``: items kept per list (None: all; the counts are always exact)."""
    violations: list[dict[str, Any]] = []

    def violation(kind: str, msg: MsgKey | None, k: SubKey | None, member: str | None, reason: str,
                  t: float | None) -> None:  # fmt: skip
        violations.append(
            {
                "kind": kind,
                "pid": msg[0] if msg else None,
                "seq": msg[1] if msg else None,
                "sub": sub_name(k) if k else None,
                "member": member,
                "reason": reason,
                "t": t,
            }
        )

    keys = set(c.opens) | {r[2:5] for r in c.records} | {x[2:5] for x in c.commits}
    subs = {k: _Sub() for k in sorted(keys)}
    by_topic: dict[str, list[MsgKey]] = {}
    for mk, (_, _, topic, _, _) in c.puts.items():
        if mk in c.acks:
            by_topic.setdefault(topic, []).append(mk)

    # Records and commits of each subscription in time order (ties: reading order).
    stream: list[tuple[float, int, str, Any]] = [(r[0], r[1], "r", r) for r in c.records]
    stream += [(x[0], x[1], "c", x) for x in c.commits]
    stream.sort(key=lambda s: (s[0], s[1]))
    at_offset: dict[tuple[int, int], tuple[MsgKey, float]] = {}  # (partition, offset) -> first message there
    conflicts: list[dict[str, Any]] = []
    conflicted: set[tuple[int, int, MsgKey]] = set()
    phantoms: set[tuple[str, MsgKey]] = set()
    regressions: list[dict[str, Any]] = []
    offsets_anywhere: dict[MsgKey, int] = {}  # a message's lowest offset seen by any subscription
    for t, _, kind, x in stream:
        k = (x[2], x[3], x[4])
        s = subs[k]
        if kind == "c":
            offset, proc = x[5], x[6]
            s.counts["commits"] += 1
            if s.committed is not None and offset < s.committed:
                s.counts["cursor_regressions"] += 1
                regressions.append(
                    {
                        "client": k[0],
                        "durable": k[1],
                        "topic": k[2],
                        "kind": "commit_back",
                        "offset": offset,
                        "committed": s.committed,
                        "t": t,
                        "proc": proc,
                    }
                )
                violation("cursor_regression", None, k, None, f"{k[2]}: committed {offset} after {s.committed} "
                          f"had been committed ({proc})", t)  # fmt: skip
            s.committed = offset if s.committed is None else max(s.committed, offset)
            continue
        _, _, _, _, topic, partition, offset, pid, seq, member, proc = x
        mk = (pid, seq)
        s.counts["records"] += 1
        s.times.append(t)
        if s.committed is not None and offset < s.committed:
            s.counts["cursor_regressions"] += 1
            regressions.append(
                {
                    "client": k[0],
                    "durable": k[1],
                    "topic": topic,
                    "kind": "read_below",
                    "offset": offset,
                    "committed": s.committed,
                    "t": t,
                    "proc": proc,
                }
            )
            violation("cursor_regression", mk, k, member, f"{topic}: got offset {offset} after the cursor was "
                      f"committed at {s.committed} ({proc})", t)  # fmt: skip
        first = at_offset.setdefault((partition, offset), (mk, t))
        if first[0] != mk and (partition, offset, mk) not in conflicted:
            conflicted.add((partition, offset, mk))
            conflicts.append({"partition": partition, "offset": offset, "first": list(first[0]), "other": list(mk),
                              "t": t})  # fmt: skip
            violation("offset_conflict", mk, k, member, f"partition {partition} offset {offset} carried "
                      f"{first[0][0]}:{first[0][1]} before: a committed record was replaced", t)  # fmt: skip
        put = c.puts.get(mk)
        if (put is None or put[2] != topic) and (topic, mk) not in phantoms:
            phantoms.add((topic, mk))
            violation("durable_phantom", mk, k, member, f"{topic} offset {offset}: never put on this topic", t)
        got = s.at.get(offset)
        if got is None:
            s.at[offset] = [1, mk, t]
            s.offsets_of.setdefault(mk, []).append(offset)
            if offset < offsets_anywhere.get(mk, offset + 1):
                offsets_anywhere[mk] = offset
        else:
            got[0] += 1

    lost: list[dict[str, Any]] = []
    duplicated: list[dict[str, Any]] = []
    latencies: list[float] = []
    for k, s in subs.items():
        n = s.counts
        n["received"] = len(s.offsets_of)
        n["redelivered"] = n["records"] - len(s.at)
        read_to = max(s.at, default=-1) + 1
        for mk, offs in s.offsets_of.items():
            put = c.puts.get(mk)
            if put is not None:
                latencies.append(s.at[offs[0]][2] - put[1])
            if len(offs) > 1:
                n["duplicated"] += 1
                duplicated.append({"pid": mk[0], "seq": mk[1], "client": k[0], "durable": k[1], "topic": k[2],
                                   "offsets": offs})  # fmt: skip
                violation(
                    "durable_duplicated",
                    mk,
                    k,
                    None,
                    f"{k[2]}: one message at offsets {', '.join(map(str, offs))} (de-duplication by offset keeps both)",
                    s.at[offs[1]][2],
                )
        high: dict[str, int] = {}
        for offset in sorted(s.at):  # (each message at its first offset: order within a producer)
            mk = s.at[offset][1]
            if s.offsets_of[mk][0] != offset:
                continue
            if mk[1] < high.get(mk[0], -1):
                n["reordered"] += 1
                violation("durable_reordered", mk, k, None, f"{k[2]}: at offset {offset}, after seq {high[mk[0]]} "
                          "of the same producer at a lower offset", s.at[offset][2])  # fmt: skip
            high[mk[0]] = max(high.get(mk[0], -1), mk[1])
        for mk in by_topic.get(k[2], ()):
            n["expected"] += 1
            if mk in s.offsets_of:
                continue
            n["lost"] += 1
            put, ack = c.puts[mk], c.acks[mk]
            known = offsets_anywhere.get(mk)
            lost.append({"pid": mk[0], "seq": mk[1], "client": k[0], "durable": k[1], "topic": k[2], "member": ack[3],
                         "t": put[1], "offset": known, "read_to": read_to})  # fmt: skip
            where = f"at offset {known} (another subscription got it)" if known is not None else "at no offset seen"
            behind = f" - it read only to offset {read_to - 1}: behind at the end" if (
                known is not None and known >= read_to) else ""  # fmt: skip
            violation(
                "durable_lost", mk, k, ack[3], f"{k[2]}: acknowledged put never received, {where}{behind}", put[1]
            )

    faults_out = []
    for start, end, fkind, target, _ in faults.intervals:
        stop = faults.stop(start, end)
        gap = 0.0
        for s in subs.values():
            g = path_gap(s.times, start, stop, fault_tail)
            if g is not None:
                gap = max(gap, g[0])
        faults_out.append({"fault": fkind, "target": target, "start": start, "end": end, "gap": gap})
    last_put = max((p[1] for p in c.puts.values()), default=-math.inf)
    longest: dict[str, Any] = {"gap": None, "sub": None, "topic": None, "t": None}
    for k, s in subs.items():
        for a, b in zip(s.times, s.times[1:], strict=False):
            if a >= last_put:
                break
            if longest["gap"] is None or b - a > longest["gap"]:
                longest = {"gap": b - a, "sub": sub_name(k), "topic": k[2], "t": a}

    totals = dict.fromkeys(DURABLE_COUNTS, 0)
    rows = []
    for k, s in subs.items():
        for f in DURABLE_COUNTS:
            totals[f] += s.counts[f]
        rows.append({"client": k[0], "durable": k[1], "topic": k[2], **s.counts, "committed": s.committed,
                     "read_to": max(s.at, default=-1) + 1})  # fmt: skip

    def cut(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return items if limit is None else items[:limit]

    lost.sort(key=lambda x: (x["pid"], x["seq"], x["client"], x["durable"], x["topic"]))
    duplicated.sort(key=lambda x: (x["pid"], x["seq"], x["client"], x["durable"], x["topic"]))
    section = {
        "puts": len(c.puts), "acknowledged": sum(1 for mk in c.puts if mk in c.acks),
        "duplicate_puts": c.put_events - len(c.puts), "crashes": c.crashes, "offset_conflicts": len(conflicts),
        "phantoms": len(phantoms), "totals": totals, "subscriptions": rows, "latency": latency_summary(latencies),
        "longest_gap": longest, "faults": faults_out, "lost": cut(lost), "duplicated": cut(duplicated),
        "regressions": cut(regressions), "conflicts": cut(conflicts),
    }  # fmt: skip
    return section, violations
