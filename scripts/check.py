"""Judge a chaos or failover run from its event logs: what was lost, duplicated or reordered,
against what each delivery mode promises. The definitions live in pipeline/rules.py.

    python scripts/check.py RUN_DIR                 # a report for people
    python scripts/check.py RUN_DIR --json          # one JSON object (schema: pipeline/rules.py docstring)
    python scripts/check.py RUN_DIR --out report.json

Exit status: 0 when no promise is broken, 1 when there is a violation, 2 when the run cannot be
judged (no run.json, no event file, no valid event). Malformed lines are reported with file and
line but do not change the status by themselves: they break no promise of the broker.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, TextIO

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from roost.pipeline import checker, rules


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f} ms"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f} s"


def render(report: dict[str, Any], out: TextIO, limit: int = 50) -> None:
    """The report for people: a table per mode, faults, agreement, then every violation."""
    run, inp, opts = report["run"], report["input"], report["options"]
    base = run["started"]

    def at(t: float | None) -> str:
        if t is None:
            return "-"
        return f"+{t - base:.3f}s" if base is not None else f"{t:.3f}"

    def more(n: int) -> None:
        if n > limit:
            print(f"  ... and {n - limit} more (--json lists all)", file=out)

    span = f"{run['ended'] - run['started']:.1f} s, " if run["started"] is not None and run["ended"] is not None else ""
    print(f"Roost run check: {run['dir']}", file=out)
    print(
        f"run: seed {run['seed']}, {span}members {' '.join(run['members']) or '?'}; {inp['events']} events in "
        f"{inp['files']} files, {inp['malformed']} malformed; grace {opts['grace']:.2f} s, "
        f"subscriber_timeout {opts['subscriber_timeout']:g} s",
        file=out,
    )
    notes = [
        f"{inp[k]} {k.replace('_', ' ')}"
        for k in ("duplicate_publishes", "unpaired_fault_ends", "phantom_deliveries", "stray_deliveries")
        if inp[k]
    ]
    if notes:
        print("note: " + ", ".join(notes), file=out)
    if inp["malformed"]:
        print(f"\nmalformed lines ({inp['malformed']}):", file=out)
        for m in inp["malformed_lines"][:limit]:
            print(f"  {m['file']}:{m['line']}: {m['error']}", file=out)
        more(inp["malformed"])

    cols = ("expected", "acknowledged", "delivered", "missing", "lost", "duplicated", "reordered", "unexpected")
    heads = ("expected", "acked", "delivered", "missing", "lost", "dup", "reord", "unexp")
    for mode, m in report["modes"].items():
        paths = m["paths"]
        print(f"\n{mode}: {len(paths)} paths (publisher -> subscriber on one subscription)", file=out)
        print(f"  {'pid':<16} {'sub':<8} {'subscription':<16}" + "".join(f"{h:>10}" for h in heads), file=out)
        for p in paths:
            name = p["topic"] + ("" if p["key"] is None else "/" + p["key"])
            print(
                f"  {p['pid'][:16]:<16} {p['sub'][:8]:<8} {name[:16]:<16}" + "".join(f"{p[c]:>10}" for c in cols),
                file=out,
            )
        print(f"  {'total':<42}" + "".join(f"{m['totals'][c]:>10}" for c in cols), file=out)
        classes = [f"{n} {cls}" for cls, n in m["lost_by_class"].items() if n]
        if classes:
            print("  lost: " + "; ".join(classes), file=out)
        lat = m["latency"]
        print(
            f"  latency (n={lat['n']}): p50 {_ms(lat['p50'])}, p90 {_ms(lat['p90'])}, p99 {_ms(lat['p99'])}, "
            f"max {_ms(lat['max'])}",
            file=out,
        )

    d = report["durable"]
    on = bool(d["puts"] or d["subscriptions"])
    if on:
        render_durable(d, out, at)
    faults = report["faults"]
    print(
        f"\nfaults ({len(faults)}): delivery gap in [start, end + {opts['fault_tail']:g} s], time to recover "
        "after the end" + (", durable: longest gap in records received" if on else ""),
        file=out,
    )
    for f, df in zip(faults, d["faults"], strict=True):
        length = "not healed" if f["end"] is None else f"{f['end'] - f['start']:.2f} s"
        print(
            f"  {at(f['start']):>12} {f['fault']:<9} {f['target']:<6} {length:>10}  gap {_s(f['gap'])}  "
            f"recover {_s(f['recover'])}  ({f['deliveries']} deliveries)"
            + (f"  durable gap {_s(df['gap'])}" if on else ""),
            file=out,
        )

    ag = report["agreement"]
    digests = " ".join(f"{k}={(v or 'unreachable')[:12]}" for k, v in ag["digests"].items())
    state = {True: "agreed", False: "DISAGREE", None: "unknown (no status events)"}[ag["agreed"]]
    missing = f"; no status from {' '.join(ag['missing'])}" if ag["missing"] else ""
    print(f"\nmembers after the last heal: {state} {digests}{missing}", file=out)

    vs = report["violations"]
    print(f"\nviolations ({len(vs)}):", file=out)
    for v in vs[:limit]:
        print(
            f"  {v['kind']:<12} pid {v['pid'] or '-'} seq {v['seq'] if v['seq'] is not None else '-'} "
            f"sub {v['sub'] or '-'} member {v['member'] or '-'} {at(v['t'])}: {v['reason']}",
            file=out,
        )
    more(len(vs))
    if vs:
        kinds: dict[str, int] = {}
        for v in vs:
            kinds[v["kind"]] = kinds.get(v["kind"], 0) + 1
        print("\nFAIL: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())), file=out)
    else:
        print("\nOK: no promise broken", file=out)


def render_durable(d: dict[str, Any], out: TextIO, at: Any) -> None:
    """The durable section: per subscription cursor (client/name on one topic), what it was owed
    and got, after de-duplication by offset (pipeline/rules.py, "Durable mode")."""
    print(
        f"\ndurable: {d['puts']} puts, {d['acknowledged']} acknowledged, {d['duplicate_puts']} put twice in "
        f"the logs; {d['crashes']} subscriber crashes before a commit",
        file=out,
    )
    cols = ("expected", "received", "records", "redelivered", "duplicated", "lost", "reordered", "commits",
            "cursor_regressions")  # fmt: skip
    heads = ("expected", "received", "records", "redeliv", "dup", "lost", "reord", "commits", "regress")
    print(f"  {'subscription':<16} {'topic':<10}" + "".join(f"{h:>9}" for h in heads) + f"{'cursor':>9}", file=out)
    for r in d["subscriptions"]:
        name = f"{r['client']}/{r['durable']}"
        cursor = "-" if r["committed"] is None else str(r["committed"])
        print(
            f"  {name[:16]:<16} {r['topic'][:10]:<10}" + "".join(f"{r[c]:>9}" for c in cols) + f"{cursor:>9}", file=out
        )
    print(f"  {'total':<27}" + "".join(f"{d['totals'][c]:>9}" for c in cols), file=out)
    print(f"  offsets carrying two messages: {d['offset_conflicts']}; records never put: {d['phantoms']}", file=out)
    lat, gap = d["latency"], d["longest_gap"]
    print(
        f"  put -> first record (n={lat['n']}): p50 {_ms(lat['p50'])}, p90 {_ms(lat['p90'])}, "
        f"p99 {_ms(lat['p99'])}, max {_ms(lat['max'])}",
        file=out,
    )
    if gap["gap"] is not None:
        print(
            f"  longest gap between records while puts went on: {_s(gap['gap'])} ({gap['sub']} {gap['topic']} "
            f"from {at(gap['t'])})",
            file=out,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Check a run directory's event logs against the delivery promises.")
    ap.add_argument("run_dir", metavar="RUN_DIR")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    ap.add_argument("--out", metavar="FILE", help="also write the JSON object to FILE")
    ap.add_argument(
        "--grace",
        type=float,
        default=rules.DEFAULT_GRACE,
        help="seconds after a subscription's confirmation before messages are expected: in a cluster "
        "it reaches the other members within a push round-trip (default %(default)s)",
    )
    ap.add_argument(
        "--subscriber-timeout", type=float, default=None, help="seconds (default: run.json's config, else 10)"
    )
    ap.add_argument(
        "--fault-tail",
        type=float,
        default=rules.DEFAULT_FAULT_TAIL,
        help="seconds after a fault's end still searched for its delivery gap (default %(default)s)",
    )
    ap.add_argument("--horizon", type=float, default=rules.DEFAULT_HORIZON,
                    help="seconds after a publish within which a member's death, a cancel or a cut-off can "
                         "explain its loss (default %(default)s)")  # fmt: skip
    ap.add_argument("--limit", type=int, default=50, help="lines per list in the report (default %(default)s)")
    a = ap.parse_args(argv)
    try:
        report = checker.check_run(a.run_dir, a.grace, a.subscriber_timeout, a.fault_tail, a.horizon)
    except checker.InputError as e:
        print(f"check: {e}", file=sys.stderr)
        return 2
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f)
            f.write("\n")
    if a.json:
        json.dump(report, sys.stdout)
        sys.stdout.write("\n")
    else:
        render(report, sys.stdout, a.limit)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
